"""What the machine can do, and what every 'auto' option becomes on it.

`--dtype auto`: bf16 is fast only where the hardware multiplies in bf16: CPUs
with AMX-BF16 or AVX512_BF16, and GPUs of compute capability 8.0 or more.
Elsewhere TensorFlow emulates it on CPUs (slower than fp32,
benchmarks/HISTORY.md), and older GPUs have fp16 tensor cores instead.
`--conv_impl auto` and `--relu_impl auto` pick the kernels that measured
fastest for that dtype on that kind of machine (levers.py). Each choice is
a pure function of what was detected, so it is tested without the hardware.

`ONEDNN_MAX_CPU_ISA` (oneDNN's own cap on the kernels it runs) caps what is
detected too: `ONEDNN_MAX_CPU_ISA=AVX2` on an AVX-512 or AMX machine makes
both oneDNN and every 'auto' here see an AVX2-only CPU, which is how the
suite and the benchmarks run as that kind of machine (README, "Test").
"""

import dataclasses
import os
from typing import FrozenSet, Mapping, Optional, Tuple

from common import env

# The /proc/cpuinfo flags that decide the CPU paths, fastest bf16 first.
BF16_CPU_FEATURES = ('amx_bf16', 'avx512_bf16')
REPORTED_CPU_FEATURES = BF16_CPU_FEATURES + ('avx512f', 'avx2')
# ResNet-18 (small stem, 28x28, batch 32, oneDNN on) trained at this share
# of its fp32 speed in bf16 on a 2-core AMD EPYC with AVX2 only
# (benchmarks/HISTORY.md, "AMD EPYC, AVX2 only").
EMULATED_BF16_SPEED = 0.13
MIN_BF16_GPU_CAPABILITY = (8, 0)

# oneDNN's ISA levels as its dnnl_cpu_isa_t bit sets (each level holds the
# bits of the ones it extends), and the level each reported feature needs.
# A cap keeps a feature when the cap's bits include the feature's level's.
ONEDNN_ISA_VAR = 'ONEDNN_MAX_CPU_ISA'
_ONEDNN_ISA_BITS = {
    'SSE41': 0x1, 'AVX': 0x3, 'AVX2': 0x7, 'AVX2_VNNI': 0xf,
    'AVX2_VNNI_2': 0x1f, 'AVX512_CORE': 0x27, 'AVX512_CORE_VNNI': 0x67,
    'AVX512_CORE_BF16': 0xe7, 'AVX10_1_512': 0x1ef,
    'AVX512_CORE_FP16': 0x1ef, 'AVX10_1_512_AMX': 0xfef,
    'AVX512_CORE_AMX': 0xfef, 'AVX10_1_512_AMX_FP16': 0x1fef,
    'AVX512_CORE_AMX_FP16': 0x1fef}
_FEATURE_ISA = {'avx2': 'AVX2', 'avx512f': 'AVX512_CORE',
                'avx512_bf16': 'AVX512_CORE_BF16',
                'amx_bf16': 'AVX512_CORE_AMX'}


@dataclasses.dataclass(frozen=True)
class Cpu:
  model: str
  features: FrozenSet[str]  # the REPORTED_CPU_FEATURES it has
  isa_cap: Optional[str] = None  # ONEDNN_MAX_CPU_ISA, where it hid some

  @property
  def has_bf16(self) -> bool:
    return bool(self.features & set(BF16_CPU_FEATURES))

  def describe(self) -> str:
    """'AMD EPYC (avx2)': the model and the features that matter here."""
    names = [f for f in REPORTED_CPU_FEATURES if f in self.features]
    capped = f'; {ONEDNN_ISA_VAR}={self.isa_cap}' if self.isa_cap else ''
    return f'{self.model} ({", ".join(names) or "no AVX2"}{capped})'


def parse_cpuinfo(text: str) -> Cpu:
  """The first processor's model name and relevant flags in /proc/cpuinfo."""
  model, flags = 'unknown CPU', set()
  for line in text.splitlines():
    key, _, value = line.partition(':')
    key = key.strip()
    if key == 'model name' and model == 'unknown CPU':
      model = value.strip()
    elif key == 'flags' and not flags:
      flags = set(value.split())
  return Cpu(model, frozenset(flags & set(REPORTED_CPU_FEATURES)))


def capped(cpu: Cpu, environ: Mapping[str, str]) -> Cpu:
  """`cpu` as oneDNN sees it under the environment's ONEDNN_MAX_CPU_ISA:
  the features above the cap hidden. Unset, DEFAULT, ALL or a name oneDNN
  does not know leave every feature (oneDNN ignores those too)."""
  cap = _ONEDNN_ISA_BITS.get(environ.get(ONEDNN_ISA_VAR, '').upper())
  if cap is None:
    return cpu
  kept = frozenset(f for f in cpu.features
                   if _ONEDNN_ISA_BITS[_FEATURE_ISA[f]] & ~cap == 0)
  if kept == cpu.features:
    return cpu
  return Cpu(cpu.model, kept, environ[ONEDNN_ISA_VAR])


def this_cpu(path: str = '/proc/cpuinfo') -> Cpu:
  try:
    with open(path) as f:
      return capped(parse_cpuinfo(f.read()), os.environ)
  except OSError:  # Not Linux: no features known, so no bf16 assumed.
    return Cpu('unknown CPU', frozenset())


@dataclasses.dataclass(frozen=True)
class Machine:
  """The CPU, and the compute capability of each visible GPU."""
  cpu: Cpu
  gpus: Tuple[Tuple[int, int], ...] = ()

  @property
  def has_gpu(self) -> bool:
    return bool(self.gpus)

  def describe(self) -> str:
    gpus = ', '.join(f'compute capability {_cc(g)}' for g in self.gpus)
    return f'{len(self.gpus)} GPU(s) ({gpus})' if gpus else self.cpu.describe()


def detect() -> Machine:
  """This machine, as TensorFlow sees its GPUs ((8, 0) for an A100)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tuple(
      tuple(tf.config.experimental.get_device_details(gpu).get(
          'compute_capability', (0, 0)))
      for gpu in tf.config.list_physical_devices('GPU'))
  return Machine(this_cpu(), gpus)


def dtype_here(requested: str) -> Tuple[str, str]:
  """choose_dtype on this machine, before the run loads TensorFlow: only a
  machine with an NVIDIA driver needs TensorFlow to see its GPUs."""
  if requested != 'auto':
    return choose_dtype(requested, Machine(this_cpu()))
  if env.has_nvidia_driver():
    return choose_dtype(requested, detect())
  return choose_dtype(requested, Machine(this_cpu()))


def choose_dtype(requested: str, machine: Machine) -> Tuple[str, str]:
  """(dtype, why) for --dtype; only 'auto' is decided here."""
  if requested != 'auto':
    return requested, f'--dtype={requested}'
  cpu = machine.cpu
  if machine.gpus:
    oldest = min(machine.gpus)
    if oldest >= MIN_BF16_GPU_CAPABILITY:
      return 'bf16', (f'auto: GPU compute capability {_cc(oldest)} has bf16 '
                      'tensor cores')
    return 'fp16', (f'auto: GPU compute capability {_cc(oldest)} < '
                    f'{_cc(MIN_BF16_GPU_CAPABILITY)} has fp16 tensor cores '
                    'but no bf16 ones (fp16 trains with dynamic loss scaling)')
  if cpu.has_bf16:
    found = [f for f in BF16_CPU_FEATURES if f in cpu.features]
    return 'bf16', f'auto: {cpu.model} has {found[0].upper()}'
  return 'fp32', (f'auto: {cpu.model} has no bf16 hardware (AMX_BF16 or '
                  'AVX512_BF16), where bf16 is emulated and slower than fp32')


def emulated_bf16_warning(dtype: str, machine: Machine) -> Optional[str]:
  """The one line for --dtype=bf16 on a CPU that only emulates it."""
  if dtype != 'bf16' or machine.has_gpu or machine.cpu.has_bf16:
    return None
  return (f'--dtype=bf16 on {machine.cpu.describe()}: this CPU has no bf16 hardware, '
          'so TensorFlow emulates it; ResNet-18 trained at '
          f'{EMULATED_BF16_SPEED:.2f}x its fp32 speed on such a CPU. '
          '--dtype=auto (or fp32) is faster here')


def _cc(capability: Tuple[int, int]) -> str:
  return f'{capability[0]}.{capability[1]}'


def uses_matmul_convs(conv_impl: str, dtype: str, machine: Machine) -> bool:
  """Whether layers.MatmulConv2D runs the convolutions. auto, by levers.py
  (benchmarks/HISTORY.md): on CPUs for bf16 (AMX 1.13x, AVX2 1.22x), and
  for fp32 on CPUs without AVX-512 (AVX2: 1.02-1.16x; no gain with
  AVX-512); GPUs keep cuDNN."""
  if conv_impl == 'auto':
    return not machine.has_gpu and (
        dtype == 'bf16' or 'avx512f' not in machine.cpu.features)
  return conv_impl == 'matmul'


def residual_relu(relu_impl: str, dtype: str, machine: Machine) -> str:
  """How the ReLUs after the residual adds train: native, bitwise or xla
  (layers.ResidualRelu). auto: xla for bf16 on CPUs (levers.py: AMX
  1.07x, AVX2 1.05x; fp32 0.90x on AVX2), else tf.nn.relu."""
  if relu_impl == 'auto':
    return 'xla' if dtype == 'bf16' and not machine.has_gpu else 'native'
  return relu_impl
