"""What a process sets up before it builds a run's model: the dtype decided
for this machine, threads, XLA, seeds and the precision policy.

Training and every tool that rebuilds a run's model (validate, average,
export) go through here, so they compute as the run did.
"""

import dataclasses
from typing import Dict, Tuple

import tensorflow as tf
import tf_keras
from absl import logging

from common import env
from resnet_keras.config import hardware
from resnet_keras.config import RunConfig
from common.errors import UsageError

_POLICIES = {'fp32': 'float32', 'bf16': 'mixed_bfloat16',
             'fp16': 'mixed_float16'}


def configure(cfg: RunConfig) -> Tuple[RunConfig, hardware.Machine, Dict]:
  """This machine, `cfg` fitted to it (fit_to_hardware) and the runtime
  configured for it (_set_tensorflow_options), before any TensorFlow op
  runs.

  Returns cfg with its dtype decided, the machine and the runtime record.
  """
  machine = hardware.detect()
  cfg, record = fit_to_hardware(cfg, machine)
  _set_tensorflow_options(cfg, machine)
  return cfg, machine, record


def fit_to_hardware(cfg: RunConfig, machine: hardware.Machine
                    ) -> Tuple[RunConfig, Dict]:
  """cfg with --dtype=auto decided, and what was decided and why.

  The second value goes into config.json and run_summary.json as 'runtime'.
  """
  dtype, why = hardware.choose_dtype(cfg.dtype, machine)
  if cfg.dtype == 'auto':
    logging.info('dtype %s (%s)', dtype, why)
  warning = hardware.emulated_bf16_warning(dtype, machine)
  if warning:
    logging.warning(warning)
  runtime = {'machine': machine.describe(), 'dtype': dtype,
             'dtype_reason': why, **env.onednn_status()}
  return dataclasses.replace(cfg, dtype=dtype), runtime


def _set_tensorflow_options(cfg: RunConfig, machine: hardware.Machine) -> None:
  """Logical CPUs, threads, XLA, seeds and precision policy (cfg.dtype is
  decided). Before TensorFlow's runtime starts: it fixes all of these."""
  has_gpu = machine.has_gpu
  if cfg.num_cpu_replicas > 1:
    split_cpu(cfg.num_cpu_replicas, has_gpu)
  # TensorFlow's Python INFO lines (collective setup, SavedModel internals)
  # drown the step lines; its warnings still show.
  tf.get_logger().setLevel('WARNING')
  if cfg.inter_op_parallelism_threads:
    tf.config.threading.set_inter_op_parallelism_threads(
        cfg.inter_op_parallelism_threads)
  if cfg.intra_op_parallelism_threads:
    tf.config.threading.set_intra_op_parallelism_threads(
        cfg.intra_op_parallelism_threads)
  if cfg.enable_xla:
    tf.config.optimizer.set_jit(True)
    if not has_gpu:
      logging.warning('--enable_xla on a CPU: XLA is typically 3-20x slower '
                      'than oneDNN here (ResNet-18 at 32 px on a 2-core '
                      'EPYC: 2.6x); it is meant for GPUs')
  if cfg.global_seed is not None:
    tf_keras.utils.set_random_seed(cfg.global_seed)
    # TensorFlow's op determinism forbids tf.timestamp (the input-wait
    # timing); the CPU kernels are deterministic without it (tested), the
    # GPU ones are not.
    if has_gpu:
      logging.info('--global_seed on a GPU: weights, data order and '
                   'augmentation are seeded, but cuDNN and atomic GPU '
                   'kernels may still make runs differ in the last bits')
  if cfg.dtype == 'fp16' and not has_gpu:
    logging.warning('--dtype=fp16 on a CPU has no hardware support and is '
                    'very slow; use --dtype=bf16 on CPUs')
  tf_keras.mixed_precision.set_global_policy(_POLICIES[cfg.dtype])


def split_cpu(num_devices: int, has_gpu: bool) -> None:
  """The CPU as `num_devices` logical devices (--num_cpu_replicas).

  They share the CPU's cores and threads: a way to run every multi-replica
  code path of -ds mirrored on a machine without GPUs, not a speed-up.
  """
  if has_gpu:
    raise UsageError(f'--num_cpu_replicas={num_devices} is for machines '
                     'without GPUs; here -ds mirrored replicates over the '
                     'GPUs (--num_gpus)')
  cpu, = tf.config.list_physical_devices('CPU')
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
