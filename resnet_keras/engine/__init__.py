"""The parts a run is built from, for training and the tools alike."""
