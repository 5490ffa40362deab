"""Process environment that must be set before TensorFlow is imported."""

import os
import platform
from typing import Dict, Mapping, Optional

from common import worker_contract

ONEDNN_VAR = 'TF_ENABLE_ONEDNN_OPTS'
ONEDNN_DEFAULTED_VAR = worker_contract.ONEDNN_DEFAULTED_VAR
_X86_64 = ('x86_64', 'amd64')


def prepare_tensorflow_environment() -> None:
  """tf_keras as Keras, oneDNN on x86-64, and TensorFlow's C++ logs quiet.

  tf_keras (Keras 2) is the Keras this project trains with; tf-models-official
  and Horovod are built on it. TensorFlow 2.20 turns its oneDNN CPU kernels on
  by default only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX; everywhere
  else its Eigen kernels train ResNets about 4x slower (benchmarks/HISTORY.md),
  so this turns oneDNN on for every x86-64 CPU. --enable_xla gets to compile
  on CPUs too (allow_xla_on_cpu). TensorFlow's CUDA build logs a
  cuInit *error* on every start on a machine without an NVIDIA driver; there
  it is noise, so C++ logs are silenced (errors still surface as Python
  exceptions). Values the user already set win.
  """
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  if (ONEDNN_VAR not in os.environ and
      platform.machine().lower() in _X86_64):
    os.environ[ONEDNN_VAR] = '1'
    os.environ[ONEDNN_DEFAULTED_VAR] = '1'
  allow_xla_on_cpu(os.environ)
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL',
                        '2' if has_nvidia_driver() else '3')


def has_nvidia_driver() -> bool:
  """Whether this machine may have NVIDIA GPUs (TensorFlow's CUDA build
  finds them through this driver)."""
  return os.path.exists('/proc/driver/nvidia/version')


def onednn_reason(environ: Mapping[str, str],
                  machine: Optional[str] = None) -> str:
  """Why oneDNN is on or off in a process with this environment."""
  value = environ.get(ONEDNN_VAR)
  if value is None:
    return (f'{ONEDNN_VAR} unset on a {machine or platform.machine()} CPU: '
            'TensorFlow\'s own default')
  if environ.get(ONEDNN_DEFAULTED_VAR) == '1' and value == '1':
    return (f'{ONEDNN_VAR}=1 set by resnet_keras on this x86-64 CPU '
            '(TensorFlow turns oneDNN on by itself only with AVX512_VNNI, '
            'AVX512_BF16 or AMX)')
  return f'{ONEDNN_VAR}={value} set in the environment'


def onednn_status() -> Dict[str, object]:
  """{'onednn': whether TensorFlow's oneDNN kernels are on, 'onednn_reason'}.

  Asks TensorFlow itself (after import), so what is recorded is what ran.
  """
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
  return {'onednn': bool(_pywrap_util_port.IsMklEnabled()),
          'onednn_reason': onednn_reason(os.environ)}


XLA_FLAGS_VAR = 'TF_XLA_FLAGS'
CPU_AUTOCLUSTERING_FLAG = '--tf_xla_cpu_global_jit'


def allow_xla_on_cpu(environ) -> None:
  """Lets --enable_xla compile on CPUs too.

  TensorFlow auto-clusters for XLA only on GPUs unless TF_XLA_FLAGS has
  --tf_xla_cpu_global_jit: without it --enable_xla compiles nothing on a CPU.
  The flag does nothing while auto-clustering is off (no --enable_xla), so it
  is set for every process, before TensorFlow reads it.
  """
  flags = environ.get(XLA_FLAGS_VAR, '')
  if CPU_AUTOCLUSTERING_FLAG not in flags.split():
    environ[XLA_FLAGS_VAR] = f'{flags} {CPU_AUTOCLUSTERING_FLAG}'.strip()
