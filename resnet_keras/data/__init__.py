"""Input data: synthetic batches and image datasets, as tf.data pipelines."""
