"""What a person sees as a run trains: log lines, a progress bar,
metrics.jsonl (reporting.py puts them together).

A training loop's output holds a `LoopRecord` (under LOOP_RECORD): the
host's copy of its per-step losses and accuracies (step_record.py reads it
off the device). `StepLogger` is an orbit train action; from that record it
prints one line per `--log_steps` even when a loop covers many of them.
Throughput is measured per loop; the run's average excludes the first loop,
which includes tracing. When steps spend more than `INPUT_BOUND_FRACTION` of
a loop waiting for their batches, it warns (once) that the input pipeline
is the bottleneck. Each log line, and each evaluation (reporting.py), is
also a record of model_dir/metrics.jsonl, which `resnet_keras.plots` draws.

TensorFlow is only imported where it is used, so the plots command starts
without it.
"""

import dataclasses
import json
import os
import sys
from typing import Callable, Dict, List, Optional, Protocol

import numpy as np
from absl import logging

from common.errors import UsageError
from resnet_keras.files import write_text_atomically
from resnet_keras.rundir import run_directory

# The key of the LoopRecord in a training loop's orbit output, beside the
# scalars orbit writes to TensorBoard.
LOOP_RECORD = 'loop_record'


@dataclasses.dataclass
class LoopRecord:
  """Host-side copy of one training loop's per-step results."""
  first_step: int  # global step after the first step of the loop
  losses: np.ndarray
  accuracies: np.ndarray
  seconds: float
  input_wait_seconds: float = 0.0  # spent blocked on the input iterator
  weights_finite: bool = True  # every model variable, at the loop's end
  stopped_early: bool = False  # a stop request ended it before its last step
  # fp16's dynamic loss scale after each step (halved on a step whose
  # gradients overflowed, which was skipped); None without loss scaling.
  loss_scales: Optional[np.ndarray] = None
  # This worker's own work in its steps (input, forward pass), waiting on
  # no other; and each worker's per step, by worker index (every worker's
  # loop has them all: trainer.Trainer.train_loop_end).
  own_seconds: float = 0.0
  own_step_seconds: Optional[np.ndarray] = None



INPUT_BOUND_FRACTION = 0.2
INPUT_BOUND_ADVICE = ('try --training_dataset_cache (if the data fits in RAM), '
                      '--data_loader_image_type=uint8, '
                      '--datasets_num_private_threads, or more CPU cores')


def format_step_line(step: int, total_steps: int, epoch: float, loss: float,
                     accuracy: float, learning_rate: float,
                     examples_per_second: float,
                     loss_scale: Optional[float] = None,
                     input_wait: float = 0.0,
                     mixed_targets: bool = False) -> str:
  """One log line; `input_wait`: the share of the loop's time its steps
  waited for their batches (what more input workers would win back).
  `mixed_targets`: the loss and accuracy are on mixup/CutMix batches (the
  accuracy counts the larger share of each target), and the line says so."""
  scale = '' if loss_scale is None else f'loss scale {loss_scale:g} | '
  mixed = ' on mixed targets' if mixed_targets else ''
  return (f'step {step}/{total_steps} | epoch {epoch:.2f} | loss{mixed} '
          f'{loss:.4f} | accuracy{mixed} {accuracy:.4f} | lr {learning_rate:.6g} | {scale}'
          f'{examples_per_second:.1f} examples/sec | input wait '
          f'{100 * input_wait:.0f}%')


class StepLogger:
  """orbit train action: log lines every `log_steps`, throughput totals."""

  def __init__(self, *, log_steps: int,
               total_steps: int, steps_per_epoch: int, global_batch_size: int,
               learning_rate_at: Callable[[int], float],
               progress_bar: Optional[bool] = None,
               metrics_log: Optional['MetricsLog'] = None,
               mixed_targets: bool = False):
    self._metrics_log = metrics_log
    self._mixed_targets = mixed_targets
    self._log_steps = log_steps
    self._total_steps = total_steps
    self._steps_per_epoch = steps_per_epoch
    self._batch = global_batch_size
    self._lr_at = learning_rate_at
    self._since_log = []
    self._loops_seen = 0
    self.steady_examples = 0
    self.steady_seconds = 0.0
    self.steady_input_wait_seconds = 0.0
    self._warned_input_bound = False
    self.all_examples = 0
    self.all_seconds = 0.0
    self.last_loss = float('nan')
    self.last_accuracy = float('nan')
    if progress_bar is None:
      progress_bar = sys.stdout.isatty()
    self._bar = None
    if progress_bar:
      import tqdm  # Only for interactive runs.
      self._bar = tqdm.tqdm(total=total_steps, unit='step', file=sys.stdout)

  def __call__(self, output: Dict) -> None:
    loop = output[LOOP_RECORD]  # Everything, step by step.
    num_steps = len(loop.losses)
    rate = num_steps * self._batch / loop.seconds if loop.seconds else 0.0
    wait = loop.input_wait_seconds / loop.seconds if loop.seconds else 0.0
    self._loops_seen += 1
    self.all_examples += num_steps * self._batch
    self.all_seconds += loop.seconds
    if self._loops_seen > 1:  # The first loop also fills the pipeline.
      self.steady_examples += num_steps * self._batch
      self.steady_seconds += loop.seconds
      self.steady_input_wait_seconds += loop.input_wait_seconds
      self._check_input_bound(loop)
    for i in range(num_steps):
      step = loop.first_step + i
      self._since_log.append((loop.losses[i], loop.accuracies[i]))
      if step % self._log_steps == 0 or step == self._total_steps:
        losses, accuracies = zip(*self._since_log)
        self._since_log = []
        record = {'step': step, 'epoch': step / self._steps_per_epoch,
                  'train_loss': float(np.mean(losses)),
                  'train_accuracy': float(np.mean(accuracies)),
                  'learning_rate': self._lr_at(step),
                  'examples_per_second': rate}
        if loop.loss_scales is not None:  # fp16: the scale after this step.
          record['loss_scale'] = float(loop.loss_scales[i])
        if self._mixed_targets:
          record['train_targets'] = 'mixed'
        line = format_step_line(
            step, self._total_steps, record['epoch'], record['train_loss'],
            record['train_accuracy'], record['learning_rate'], rate,
            record.get('loss_scale'), wait, self._mixed_targets)
        if self._bar is not None:
          try:
            self._bar.write(line)
          except OSError:
            # Its terminal closed (SIGHUP: the run saves and stops at this
            # loop's end); the log's line still goes to stderr.
            self._bar = None
        logging.info(line)
        if self._metrics_log is not None:
          self._metrics_log.append(record)
    if num_steps:
      self.last_loss = float(loop.losses[-1])
      self.last_accuracy = float(loop.accuracies[-1])
    if self._bar is not None:
      self._bar.update(num_steps)
      self._bar.set_postfix(loss=f'{self.last_loss:.3f}')

  def _check_input_bound(self, loop: LoopRecord) -> None:
    fraction = loop.input_wait_seconds / loop.seconds if loop.seconds else 0.0
    if fraction > INPUT_BOUND_FRACTION and not self._warned_input_bound:
      self._warned_input_bound = True
      logging.warning(
          'input-bound: steps %d-%d waited for their batches %.0f%% of the '
          'time; %s', loop.first_step, loop.first_step + len(loop.losses) - 1,
          100 * fraction, INPUT_BOUND_ADVICE)

  @property
  def input_wait_fraction(self) -> float:
    """Share of steady-state training time spent waiting for input."""
    if not self.steady_seconds:
      return 0.0
    return self.steady_input_wait_seconds / self.steady_seconds

  @property
  def average_examples_per_second(self) -> float:
    """Steady-state throughput; all loops when there was only one."""
    if self.steady_seconds:
      return self.steady_examples / self.steady_seconds
    return self.all_examples / self.all_seconds if self.all_seconds else 0.0

  def close(self):
    if self._bar is not None:
      self._bar.close()


class MetricsLog:
  """model_dir/metrics.jsonl: one JSON object per line, appended as it goes.

  Log-line records have step, epoch, train_loss, train_accuracy,
  learning_rate and examples_per_second; evaluation records have step, epoch,
  eval_loss, eval_accuracy (top-1), eval_top5_accuracy and eval_examples.
  Only the chief writes it, from the values it logs. A `mirror` (such as
  tracking.WandbMirror) gets every appended record too, so other trackers
  see exactly what the file holds.
  """

  def __init__(self, model_dir: str, mirror: Optional['Mirror'] = None):
    self.model_dir = model_dir
    self.path = os.path.join(model_dir, run_directory.METRICS_FILE)
    self._mirror = mirror

  def resume_at(self, step: int) -> List[Dict]:
    """Drops records past `step`: a run resumed there trains them again.
    Returns the records kept."""
    kept = [r for r in read_metrics_log(self.model_dir) if r['step'] <= step]
    write_text_atomically(self.path,
                          ''.join(json.dumps(r) + '\n' for r in kept))
    return kept

  def append(self, record: Dict) -> None:
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')
    if self._mirror is not None:
      self._mirror.log(record)

  def close(self) -> None:
    if self._mirror is not None:
      self._mirror.finish()


class Mirror(Protocol):
  """Where MetricsLog also sends its records."""

  def log(self, record: Dict) -> None:
    ...

  def finish(self) -> None:
    ...


def read_metrics_log(model_dir: str) -> List[Dict]:
  """The records of model_dir/metrics.jsonl in order; [] if there is none."""
  path = os.path.join(model_dir, run_directory.METRICS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [l for l in f.read().splitlines() if l.strip()]
  records = []
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
    except ValueError:
      # A run killed while appending leaves a torn last line; that one alone
      # is expected.
      if i < len(lines) - 1:
        raise UsageError(f'{path} line {i + 1} is not JSON; delete the line '
                         'or the file') from None
      continue
    if not (isinstance(record, dict) and isinstance(record.get('step'), int)):
      raise UsageError(f'{path} line {i + 1} is not a record of a step (an '
                       'object with an integer "step"); delete the line or '
                       'the file')
    records.append(record)
  return records


def write_hparams(summary_dir: str, hparams: Dict) -> None:
  """Records the run's flags in TensorBoard's HParams dashboard."""
  import tensorflow as tf
  from tensorboard.plugins.hparams import api as hp
  clean = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
           for k, v in hparams.items()}
  with tf.summary.create_file_writer(summary_dir).as_default():
    hp.hparams(clean)
