"""--dtype auto and the CPU facts it rests on, without the hardware (fake
CPUs: support/cpus.py)."""

import pytest

from resnet_keras.config import hardware
from tests.support.cpus import (CPUINFO, COOPER_LAKE, EPYC_AVX2,
                                SAPPHIRE_RAPIDS, SKYLAKE)


def test_parse_cpuinfo_keeps_the_model_and_the_features_that_matter():
  assert SAPPHIRE_RAPIDS.model == 'Intel(R) Xeon(R) Platinum 8481C'
  assert SAPPHIRE_RAPIDS.features == {'amx_bf16', 'avx512_bf16', 'avx512f',
                                      'avx2'}
  assert SAPPHIRE_RAPIDS.describe() == (
      'Intel(R) Xeon(R) Platinum 8481C (amx_bf16, avx512_bf16, avx512f, avx2)')
  assert EPYC_AVX2.describe() == 'AMD EPYC (avx2)'
  assert hardware.parse_cpuinfo('').describe() == 'unknown CPU (no AVX2)'


@pytest.mark.parametrize('cpu,gpus,dtype,reason', [
    (SAPPHIRE_RAPIDS, (), 'bf16', 'has AMX_BF16'),
    (COOPER_LAKE, (), 'bf16', 'has AVX512_BF16'),
    (EPYC_AVX2, (), 'fp32', 'no bf16 hardware'),
    (SKYLAKE, (), 'fp32', 'no bf16 hardware'),
    # GPUs decide over the CPU: A100/H100 bf16, V100/T4 fp16.
    (EPYC_AVX2, ((8, 0), (9, 0)), 'bf16', 'compute capability 8.0 has bf16'),
    (SAPPHIRE_RAPIDS, ((7, 0),), 'fp16', 'compute capability 7.0 < 8.0'),
    # The oldest GPU of a mixed host decides: every replica must run it.
    (SAPPHIRE_RAPIDS, ((8, 0), (7, 5)), 'fp16', 'capability 7.5'),
])
def test_auto_dtype_follows_the_hardware(cpu, gpus, dtype, reason):
  chosen, why = hardware.choose_dtype('auto', hardware.Machine(cpu, gpus))
  assert chosen == dtype
  assert why.startswith('auto: ') and reason in why


@pytest.mark.parametrize('requested', ['fp32', 'bf16', 'fp16'])
def test_an_explicit_dtype_always_stands(requested):
  for machine in (hardware.Machine(EPYC_AVX2), hardware.Machine(
      SAPPHIRE_RAPIDS, ((7, 0),))):
    assert hardware.choose_dtype(requested, machine) == (
        requested, f'--dtype={requested}')


def test_bf16_on_a_cpu_that_emulates_it_gets_one_warning():
  warning = hardware.emulated_bf16_warning('bf16', hardware.Machine(EPYC_AVX2))
  assert 'AMD EPYC (avx2)' in warning and 'emulates' in warning
  assert f'{hardware.EMULATED_BF16_SPEED:.2f}x its fp32 speed' in warning
  assert '\n' not in warning
  for dtype, machine in (
      ('fp32', hardware.Machine(EPYC_AVX2)),
      ('bf16', hardware.Machine(SAPPHIRE_RAPIDS)),
      ('bf16', hardware.Machine(EPYC_AVX2, ((8, 0),)))):
    assert hardware.emulated_bf16_warning(dtype, machine) is None


def test_this_cpu_reads_proc_cpuinfo(tmp_path):
  path = tmp_path / 'cpuinfo'
  path.write_text(CPUINFO.format(model='Test CPU', flags='avx2',
                                 vendor='x'))
  assert hardware.this_cpu(str(path)).describe() == 'Test CPU (avx2)'
  assert hardware.this_cpu(str(tmp_path / 'missing')).features == frozenset()


@pytest.mark.parametrize('cap,features', [
    ('AVX2', {'avx2'}),
    ('avx512_core', {'avx2', 'avx512f'}),
    ('AVX512_CORE_VNNI', {'avx2', 'avx512f'}),
    ('AVX512_CORE_BF16', {'avx2', 'avx512f', 'avx512_bf16'}),
    # AVX2 with bf16 conversions is no AVX-512.
    ('AVX2_VNNI_2', {'avx2'}),
    ('AVX512_CORE_AMX', {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}),
])
def test_onednn_max_cpu_isa_hides_the_features_above_it(cap, features):
  """ONEDNN_MAX_CPU_ISA=AVX2 makes an AMX machine an AVX2-only one for
  every 'auto' as well as for oneDNN: how the suite runs as that kind."""
  cpu = hardware.capped(SAPPHIRE_RAPIDS, {'ONEDNN_MAX_CPU_ISA': cap})
  assert cpu.features == features
  if cap.upper() != 'AVX512_CORE_AMX':
    assert cpu.describe().endswith(f'; ONEDNN_MAX_CPU_ISA={cap})')
  machine = hardware.Machine(cpu)
  assert hardware.choose_dtype('auto', machine)[0] == (
      'bf16' if cpu.has_bf16 else 'fp32')


@pytest.mark.parametrize('environ', [{}, {'ONEDNN_MAX_CPU_ISA': 'ALL'},
                                     {'ONEDNN_MAX_CPU_ISA': 'DEFAULT'},
                                     {'ONEDNN_MAX_CPU_ISA': 'nonsense'}])
def test_no_cap_or_one_onednn_ignores_hides_nothing(environ):
  assert hardware.capped(SAPPHIRE_RAPIDS, environ) == SAPPHIRE_RAPIDS
  # A cap above what the CPU has hides nothing either, and says nothing.
  assert hardware.capped(EPYC_AVX2, {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE'}) \
      == EPYC_AVX2


def test_this_cpu_reads_the_cap_from_the_environment(tmp_path, monkeypatch):
  path = tmp_path / 'cpuinfo'
  path.write_text(CPUINFO.format(model='Test CPU', flags='avx2 avx512f '
                                 'avx512_bf16', vendor='x'))
  monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX2')
  assert hardware.this_cpu(str(path)).describe() == (
      'Test CPU (avx2; ONEDNN_MAX_CPU_ISA=AVX2)')


def test_dtype_here_needs_tensorflow_only_where_gpus_may_be(monkeypatch):
  """What --dtype auto becomes, decided when a recipe's fp32 block is read:
  from /proc/cpuinfo alone unless an NVIDIA driver is installed."""
  detected = []

  def detect():
    detected.append(True)
    return hardware.Machine(EPYC_AVX2, ((7, 0),))

  monkeypatch.setattr(hardware, 'this_cpu', lambda: EPYC_AVX2)
  monkeypatch.setattr(hardware, 'detect', detect)
  monkeypatch.setattr(hardware.env, 'has_nvidia_driver', lambda: False)
  assert hardware.dtype_here('auto')[0] == 'fp32'
  assert hardware.dtype_here('bf16') == ('bf16', '--dtype=bf16')
  assert not detected
  monkeypatch.setattr(hardware.env, 'has_nvidia_driver', lambda: True)
  assert hardware.dtype_here('auto')[0] == 'fp16' and detected
