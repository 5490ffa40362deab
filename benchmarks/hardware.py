"""This machine's limits, measured: matmul peak and ResNet-50's FLOP count.

Model FLOP utilisation (MFU) = achieved training FLOP/s / matmul peak. The
peak is what TensorFlow's own matmul reaches on this machine (not a vendor
sheet), measured in the same run as the training it is compared with.
"""

import time

import tensorflow as tf

# Multiply-accumulates of one ResNet-50 v1.5 forward pass at 224x224: 4.1 G
# (8.2 GFLOP). Training costs about 3x the forward pass (forward, gradients
# with respect to activations, gradients with respect to weights).
RESNET50_TRAIN_GFLOP_PER_IMAGE_224 = 3 * 2 * 4.1


def resnet50_train_gflop_per_image(image_size: int = 224) -> float:
  return RESNET50_TRAIN_GFLOP_PER_IMAGE_224 * (image_size / 224) ** 2


def matmul_peak_gflops(dtype: str, size: int = 2048, repeats: int = 20) -> float:
  """GFLOP/s of a size^3 matmul in `dtype` ('fp32' or 'bf16')."""
  tf_dtype = {'fp32': tf.float32, 'bf16': tf.bfloat16}[dtype]
  a = tf.cast(tf.random.normal([size, size]), tf_dtype)
  matmul = tf.function(lambda: tf.matmul(a, a))
  matmul().numpy()  # Trace and warm up.
  best = float('inf')
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(repeats):
      out = matmul()
    out.numpy()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 * repeats / best / 1e9
