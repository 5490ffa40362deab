"""Progressive resizing (FFCV's ramp): training starts at
--progressive_resize_start_size and rises to --image_size over
--progressive_resize_epochs. Its image-size schedule, and the switch of the
trainer's input from one size to the next as the run's loop reaches a new
epoch (run.py says when; assembly.py builds the input at each size)."""

from typing import Any, Callable

from absl import logging

from resnet_keras.config import RunConfig


def image_size_at(epoch: int, start_size: int, end_size: int,
                  start_epoch: int, end_epoch: int, multiple: int) -> int:
  """Progressive resizing's training size in `epoch` (from 0): `start_size`
  up to `start_epoch`, `end_size` from `end_epoch`, linear in between,
  rounded to the nearest multiple of `multiple` (FFCV's ramp) and kept
  inside [start_size, end_size]."""
  if epoch >= end_epoch:
    return end_size
  if epoch <= start_epoch:
    return start_size
  size = start_size + (end_size - start_size) * (
      (epoch - start_epoch) / (end_epoch - start_epoch))
  return min(max(int(round(size / multiple)) * multiple, start_size), end_size)


def image_size_for_run(cfg: RunConfig, epoch: int) -> int:
  """The training size the flags ask for in `epoch`: --image_size, or the
  progressive schedule's."""
  if not cfg.progressive_resize_start_size:
    return cfg.image_size
  first, last = cfg.resize_epochs
  return image_size_at(epoch, cfg.progressive_resize_start_size,
                       cfg.image_size, first, last, cfg.resize_multiple)


class TrainingInput:
  """The trainer's training input at the size of the epoch a step is in.
  `make(image_size, data_start)`: the distributed training input at that
  size, from the batch after `data_start` batches of the run's data.
  `size`: the size of the trainer's input now (at first, that of the
  epoch `step` is in)."""

  def __init__(self, cfg: RunConfig, steps_per_epoch: int,
               make: Callable[[int, int], Any], step: int):
    self._cfg, self._steps_per_epoch, self._make = cfg, steps_per_epoch, make
    self.size = image_size_for_run(cfg, step // steps_per_epoch)

  def follow(self, trainer: Any, step: int, data_start: int,
             announce: bool) -> None:
    """Gives `trainer` the input at the size of the epoch `step` is in, if
    that is a new size (stops fall on epoch ends), and says so (or, with
    `announce`, the size it starts at). The input goes on from the batch
    after `data_start` batches of the run's data, as one input of changing
    size would (exact resume); each size traces the training loop once."""
    epoch = step // self._steps_per_epoch
    size = image_size_for_run(self._cfg, epoch)
    if size != self.size:
      trainer.train_dataset = self._make(size, data_start)
      self.size = size
    elif not announce:
      return
    logging.info('progressive resizing: training at %d px from epoch %d (step '
                 '%d)', size, epoch, step)
