"""Fake CPUs, as /proc/cpuinfo describes them: --dtype auto and the kernel
choices without the hardware (unit/test_hardware.py, unit/test_network.py)."""

from resnet_keras.config import hardware

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: fpu sse2 {flags}

processor\t: 1
model name\t: {model}
flags\t\t: fpu sse2 {flags}
"""


def cpu(model, flags, vendor='GenuineIntel'):
  return hardware.parse_cpuinfo(CPUINFO.format(model=model, flags=flags,
                                               vendor=vendor))


SAPPHIRE_RAPIDS = cpu('Intel(R) Xeon(R) Platinum 8481C',
                      'avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile')
COOPER_LAKE = cpu('Intel(R) Xeon(R) Platinum 8380H',
                  'avx2 avx512f avx512_bf16')
EPYC_AVX2 = cpu('AMD EPYC', 'avx avx2 fma', vendor='AuthenticAMD')
SKYLAKE = cpu('Intel(R) Xeon(R) Gold 6148', 'avx2 avx512f')
