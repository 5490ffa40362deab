"""How the run executes, apart from what it computes: numeric precision,
compilation and kernels (PrecisionConfig), and where it runs: distribution,
devices, threads (RuntimeConfig); each with its choices and its own
checks."""

import dataclasses

from common.errors import UsageError
from resnet_keras.config.options import check_fields, option

DTYPES = ('fp32', 'bf16', 'fp16', 'auto')
CONV_IMPLS = ('auto', 'native', 'matmul')
RELU_IMPLS = ('auto', 'native', 'bitwise', 'xla')


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
  """Numeric precision, compilation, and the kernels that run the
  network (their auto choices follow the dtype and the machine)."""
  dtype: str = option(
      'fp32',
      'Compute precision: fp32, bf16 (mixed_bfloat16; fast on CPUs with '
      'AMX-BF16/AVX512_BF16 and on GPUs of compute capability >= 8.0, '
      'emulated and slower than fp32 on other CPUs), fp16 '
      '(mixed_float16 with loss scaling; GPU only in practice), or auto '
      '(bf16 where it is fast, fp16 on older GPUs, fp32 elsewhere; the '
      'choice and why are logged and recorded in config.json).', alias='dt',
      choices=DTYPES)
  loss_scale: float = option(
      0.0,
      'fp16: a fixed loss scale; 0: dynamic loss scaling.',
      within='>= 0')
  enable_xla: bool = option(
      False,
      'Compile with XLA (auto-clustering). For GPUs; on CPUs it is '
      'slower than the default oneDNN kernels.')
  conv_impl: str = option(
      'auto',
      'How convolutions run: native (oneDNN/cuDNN), matmul (1x1 '
      'convolutions as one matmul, and kernel gradients of 3x3 '
      'convolutions on maps <= 7x7 with >= 256 channels as patches x '
      'matmul: much faster in bf16 on CPUs with AMX), or auto (matmul '
      'for bf16 on CPUs, and for fp32 on CPUs without AVX-512). Same '
      'weights and results either way.',
      choices=CONV_IMPLS)
  relu_impl: str = option(
      'auto',
      'How the ReLU after each residual add runs in training: native '
      '(tf.nn.relu), xla (the add and the ReLU as one XLA-compiled '
      'kernel, same results: ~7% faster ResNet-50 training in bf16 on '
      "CPUs), bitwise (an integer max on the floats' bits, no XLA; same "
      'results except that a negative NaN becomes 0), or auto (xla for '
      'bf16 on CPUs). Evaluation and export always run tf.nn.relu.',
      choices=RELU_IMPLS)

  def _check_precision(self) -> None:
    check_fields(self, PrecisionConfig)


DISTRIBUTION_STRATEGIES = ('off', 'one_device', 'mirrored',
                           'multi_worker_mirrored')


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Where it runs: distribution, devices, threads."""
  distribution_strategy: str = option(
      'off',
      'off, one_device, mirrored (GPUs of one host) or '
      'multi_worker_mirrored (several processes or hosts; TF_CONFIG, or '
      'derived from the MPI rank under mpirun).', alias='ds',
      choices=DISTRIBUTION_STRATEGIES)
  use_horovod: bool = option(
      False,
      'Train with Horovod: one process per worker (started by mpirun, '
      'e.g. via demo_resnet_keras.py); --batch_size is per worker.')
  num_gpus: int = option(
      -1,
      'GPUs for mirrored/one_device; -1: every visible GPU.')
  num_cpu_replicas: int = option(
      1,
      'With -ds mirrored on a machine without GPUs: split the CPU into '
      'this many logical devices, one replica each, to try '
      'multi-replica training (per-replica batches, cross-replica '
      'reductions, sync batch norm) without GPUs. No faster: the '
      'replicas share the cores (2-core AVX2 EPYC, ResNet-18 28x28 '
      'batch 128: 87 img/s with one replica, 86 with two).',
      within='> 0')
  inter_op_parallelism_threads: int = option(
      0,
      'Threads running independent ops; 0: TensorFlow picks.',
      within='>= 0')
  intra_op_parallelism_threads: int = option(
      0,
      'Threads inside one op; 0: TensorFlow picks.',
      within='>= 0')

  def _check_runtime(self) -> None:
    if self.distribution_strategy == 'hpu':
      raise UsageError('--distribution_strategy=hpu is Gaudi-only; use '
                       'mirrored (GPUs of one host), multi_worker_mirrored '
                       '(several processes or hosts) or --use_horovod')
    check_fields(self, RuntimeConfig)
    if self.use_horovod and self.distribution_strategy != 'off':
      raise UsageError(
          f'--use_horovod and --distribution_strategy='
          f'{self.distribution_strategy} both distribute training; use one '
          '(Horovod needs --distribution_strategy=off)')
    if self.num_cpu_replicas > 1 and self.distribution_strategy != 'mirrored':
      raise UsageError(
          f'--num_cpu_replicas={self.num_cpu_replicas} splits the CPU into '
          'replicas of -ds mirrored; add --distribution_strategy=mirrored '
          f'(not {self.distribution_strategy})')
