"""The options several tools share, each declared once: --checkpoint,
--data_dir, --eval_flip, --output_dir and --saved_model (--model_dir:
common/cli.py); and the run the options name, as a RunConfig (`run_config`),
as flags.py gives training's.

A tool says only what its own use adds to an option's help (what it does
with the checkpoint, what it reads of the data); name, type, default and
the rest of the help are the option's, the same in every tool.
"""

import dataclasses
from typing import Optional, Tuple

from absl import flags

from resnet_keras.rundir import checkpoints
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan

# What an export is, wherever a tool takes one.
_EXPORT_KINDS = ('a SavedModel directory (model_dir/saved_model of a run '
                 'with --enable_checkpoint_and_export, or one python -m '
                 'resnet_keras.export wrote), or an .onnx or .tflite file '
                 '(export --format). A SavedModel is a program (loading '
                 'it runs its graph, which can read and write files): load '
                 'only ones you trust')


def define_checkpoint(values: flags.FlagValues, verb: str) -> None:
  """--checkpoint: which of the run's checkpoints the tool `verb`s."""
  flags.DEFINE_string('checkpoint', None,
                      f'The checkpoint to {verb} (a path, or a name in '
                      '--model_dir such as ckpt-4), or "all" for every '
                      'checkpoint kept; default: the latest.',
                      flag_values=values)


def define_data_dir(values: flags.FlagValues, use: str) -> None:
  """--data_dir, other (or moved) data of the run's format; `use`: what the
  tool reads of it."""
  flags.DEFINE_string('data_dir', None,
                      'Read the run\'s data here instead of its data_dir '
                      '(same --dataset format; real data even for a '
                      f'synthetic-data run): {use}.',
                      flag_values=values)


def define_eval_flip(values: flags.FlagValues,
                     default: Optional[bool]) -> None:
  """--eval_flip; a `default` of None: as the run evaluated."""
  as_run = (', or not (--noeval_flip); default: as the run evaluated'
            if default is None else '')
  flags.DEFINE_boolean('eval_flip', default,
                       'Average each image\'s and its mirror\'s logits '
                       '(test-time flip augmentation, as evaluation\'s '
                       f'--eval_flip){as_run}.',
                       flag_values=values)


def define_output_dir(values: flags.FlagValues, what: str,
                      default_dir: str) -> None:
  """--output_dir, where `what` the tool writes goes; by default the run's
  `default_dir`."""
  flags.DEFINE_string('output_dir', None,
                      f'Where {what} goes; default: MODEL_DIR/{default_dir}.',
                      flag_values=values)


def define_saved_model(values: flags.FlagValues, use: str,
                       several: bool = False) -> None:
  """--saved_model, the export the tool reads (required), or with `several`
  the comma-separated exports; `use`: what the tool does with it."""
  if several:
    flags.DEFINE_list('saved_model', None,
                      f'{use}, comma-separated: each {_EXPORT_KINDS}.',
                      flag_values=values)
  else:
    flags.DEFINE_string('saved_model', None, f'{use}: {_EXPORT_KINDS}.',
                        flag_values=values)
    flags.mark_flag_as_required('saved_model', flag_values=values)


def run_config(values: flags.FlagValues) -> Tuple[RunConfig, TrainingPlan]:
  """The run at --model_dir as its config.json records it, with the tool's
  --data_dir and --eval_flip, where it has them, over it."""
  cfg, plan = checkpoints.read_config(values.model_dir)
  if 'data_dir' in values and values.data_dir:
    cfg = dataclasses.replace(cfg, data_dir=values.data_dir,
                              use_synthetic_data=False)
  if 'eval_flip' in values and values.eval_flip is not None:
    cfg = dataclasses.replace(cfg, eval_flip=values.eval_flip)
  return cfg, plan
