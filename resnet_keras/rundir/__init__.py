"""The run directory (model_dir): its files, its one writer, its checkpoints."""
