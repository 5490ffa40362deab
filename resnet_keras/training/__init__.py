"""A training run over time: when things happen, what it reports, its end."""
