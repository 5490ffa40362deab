"""How the weights move: optimizers, learning-rate schedules, weight average."""
