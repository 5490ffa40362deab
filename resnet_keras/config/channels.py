"""The channel counts of this project's ResNets, without TensorFlow: what
the network builds (network.py), what the options check and name
(config/model_options.py), and what the PyTorch reference matches
(benchmarks/pytorch_reference.py)."""

from typing import Tuple

# Output channels of the ResNet's stages; the stem has the first, bottleneck
# blocks 4x. --width_multiplier scales them to multiples of CHANNEL_MULTIPLE.
STAGE_FILTERS = (64, 128, 256, 512)
CHANNEL_MULTIPLE = 8


def scaled_filters(filters: Tuple[int, ...],
                   multiplier: float) -> Tuple[int, ...]:
  """Each count x multiplier, to the nearest multiple of CHANNEL_MULTIPLE
  (at least one): SIMD and matmul kernels run whole vectors."""
  return tuple(max(CHANNEL_MULTIPLE,
                   CHANNEL_MULTIPLE * round(f * multiplier / CHANNEL_MULTIPLE))
               for f in filters)

