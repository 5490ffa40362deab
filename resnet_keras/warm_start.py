"""A new run that starts from another run's checkpoint.

  --restore_from PATH [--restore_optimizer]   the same model, as it was saved
  --pretrained_checkpoint PATH [--freeze_backbone]   its backbone, a new head

PATH is a checkpoint prefix (DIR/ckpt-8) or a run's model_dir (its latest
checkpoint). The config.json beside the checkpoint (every training run and
`python -m resnet_keras.average` write one) says what model it holds, so a
mismatch is refused in one line naming both models before anything runs.

Both only decide where a run starts: once its own model_dir has a checkpoint,
rerunning the same command resumes from that, as any run does. The start is
recorded in model_dir/warm_start.json: a run that began at a restored step
S has read (step - S) batches of its data at a later step, which is what an
exact resume (--global_seed) skips.

--restore_from restores the checkpoint into this run's model (and, with
--restore_optimizer, its optimizer: slots, step and loss scale, so the
learning-rate schedule goes on from that step). --pretrained_checkpoint needs
the same architecture but not the same classes: the checkpoint is restored
into a model built from its own config, and every layer but the head is
copied from there by name; the head keeps its fresh initialisation.
"""

import dataclasses
import json
import os
from typing import Optional

import tensorflow as tf
from absl import logging

from resnet_keras import checkpoints
from resnet_keras import models
from resnet_keras.config import RunConfig
from common.errors import UsageError
from resnet_keras.metrics import write_json_atomically

RESTORE_FLAG = '--restore_from'
PRETRAINED_FLAG = '--pretrained_checkpoint'
START_FILE = 'warm_start.json'


@dataclasses.dataclass(frozen=True)
class Source:
  """The checkpoint a run starts from, and the run that wrote it."""
  flag: str
  checkpoint: str
  cfg: RunConfig


def checkpoint_prefix(flag: str, path: str) -> str:
  """`path` as a checkpoint prefix: itself, or a directory's latest."""
  if os.path.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if not latest:
      raise UsageError(f'{flag}={path} is a directory without checkpoints; '
                       'name a run\'s model_dir or one of its checkpoints')
    return latest
  if not os.path.exists(path + '.index'):
    raise UsageError(f'{flag}={path} is neither a directory nor a checkpoint '
                     f'(no {path}.index)')
  return path


def compared_identity(flag: str, cfg: RunConfig) -> dict:
  """What the source must share with this run: the whole model to restore
  it, the architecture (not the classes) to take its backbone."""
  identity = checkpoints.model_identity(cfg)
  if flag == PRETRAINED_FLAG:
    del identity['num_classes']
  return identity


def resolve(cfg: RunConfig) -> Optional[Source]:
  """The checkpoint this run starts from; None if it starts from scratch or
  resumes from its own.

  Args:
    cfg: the effective config (num_classes resolved).
  """
  flag, path = ((RESTORE_FLAG, cfg.restore_from) if cfg.restore_from else
                (PRETRAINED_FLAG, cfg.pretrained_checkpoint))
  if not path:
    return None
  own = checkpoints.latest_step(cfg.model_dir)
  if own:
    logging.info('%s ignored: --model_dir=%s has its own checkpoint (step %d) '
                 'and resumes from it', flag, cfg.model_dir, own)
    return None
  prefix = checkpoint_prefix(flag, path)
  try:
    source_cfg, _ = checkpoints.read_config(os.path.dirname(prefix))
  except UsageError as e:
    raise UsageError(f'{flag}={path}: {e}') from None
  saved, wanted = (checkpoints.describe_identity(compared_identity(flag, c))
                   for c in (source_cfg, cfg))
  if saved != wanted:
    raise UsageError(f'{flag}={path} holds another model ({saved}; this run: '
                     f'{wanted})')
  return Source(flag, prefix, source_cfg)


def apply(source: Source, network, model, optimizer,
          restore_optimizer: bool) -> None:
  """Loads `source` into this run's (network, training model, optimizer)."""
  if source.flag == PRETRAINED_FLAG:
    _load_backbone(source, network)
    logging.info('%s: backbone from %s (%d classes); new %d-class head',
                 source.flag, source.checkpoint, source.cfg.num_classes,
                 network.output_shape[-1])
    return
  objects = {'model': model}
  if restore_optimizer:
    objects['optimizer'] = optimizer
  checkpoints.restore(tf.train.Checkpoint(**objects), source.checkpoint,
                      source.cfg)
  logging.info('%s: started from %s (%s, step %d)', source.flag,
               source.checkpoint,
               'weights and optimizer' if restore_optimizer else 'weights only',
               int(optimizer.iterations.numpy()))


def _load_backbone(source: Source, network) -> None:
  source_network, source_model = models.build_models(
      source.cfg, source.cfg.num_classes, use_regularizers=False)
  checkpoints.restore(tf.train.Checkpoint(model=source_model),
                      source.checkpoint, source.cfg)
  for layer in models.backbone_layers(network):
    layer.set_weights(source_network.get_layer(layer.name).get_weights())


def record_start(model_dir: str, source: Source, step: int) -> None:
  """Notes in model_dir where this run started (chief only)."""
  write_json_atomically(os.path.join(model_dir, START_FILE),
                        {'flag': source.flag, 'checkpoint': source.checkpoint,
                         'step': step})


def steps_of_data_read(model_dir: str) -> int:
  """Batches this model_dir's run has drawn from its own data by its latest
  checkpoint: the checkpoint's step, less the step a warm start began at."""
  step = checkpoints.latest_step(model_dir)
  path = os.path.join(model_dir, START_FILE)
  if not step or not os.path.exists(path):
    return step
  with open(path) as f:
    return step - json.load(f)['step']
