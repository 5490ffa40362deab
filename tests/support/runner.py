"""Running the entry points in tests, and what every kind of test shares
about a run: the tiny recipe, the repository's paths, reading a run back.

`run_main` and `run_tool` call an entry point's `main` in this process, as
its `__main__` would (cli.run_entry_point: flags parsed from argv, errors
reported in one line, an exit code): seconds cheaper than a new interpreter,
with the same flags, outputs, log lines and exit codes. The `spawn_*`
helpers start a real process, for tests whose point is the process: signals,
exit codes of a fresh interpreter, mpirun, ssh, environment read at start-up
(TF_CPP_MIN_LOG_LEVEL, TF_XLA_FLAGS, PYTHONPATH), absl's --help.
"""

import contextlib
import dataclasses
import glob
import importlib
import io
import json
import logging as py_logging
import os
import shutil
import subprocess
import sys
import traceback
from typing import Mapping, Optional, Sequence
from unittest import mock

from absl import flags
from absl import logging

from common import cli
from tests.support import deadlines
from resnet_keras.config import RunConfig

# The repository (tests/support/runner.py is two levels below it): the
# working directory of every process a test starts.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MAIN = os.path.join(REPO_ROOT, 'resnet_ctl_imagenet_main.py')

# The tiny recipe, as RunConfig fields: a small, fast run, ResNet-10 at a
# quarter width on 32x32 synthetic images, 4 steps of 8 in loops of 2, 13
# evaluation examples (a partial last batch), no plots (matplotlib's import
# and drawing were a sixth of a tiny run's CPU; the runs that test them turn
# them on). Tests where the model's size is the point say so with their own
# flags.
TINY_RECIPE = {
    'plots': False, 'use_synthetic_data': True, 'resnet_depth': 10,
    'width_multiplier': 0.25, 'image_size': 32, 'num_classes': 10,
    'batch_size': 8, 'train_steps': 4, 'steps_per_loop': 2, 'log_steps': 2,
    'num_eval_examples': 13}


def _flag(name, value):
  if value is True:
    return f'--{name}'
  return f'--{name}={value}'


# The tiny recipe as the entry points' flags, in its order (tests slice it).
TINY = [_flag(name, value) for name, value in TINY_RECIPE.items()]


def tiny_config(model_dir, **changes) -> RunConfig:
  """The tiny recipe as a RunConfig in `model_dir`, for calling run.run in
  this process; `changes` replace or add fields."""
  return RunConfig(**{**TINY_RECIPE, 'model_dir': str(model_dir), **changes})


# The time-to-accuracy techniques together (--zero_init_residual,
# --ema_decay, --eval_flip, progressive resizing with --eval_image_size,
# --blurpool, the linear schedule by epoch, label smoothing, the PCA stem)
# and timm's ("ResNet strikes back": RandAugment, random erasing, repeated
# augmentation, mixup and CutMix, drop path, LAMB with clipping, BCE): on
# records_run's 16 training images in batches of 4, 4 steps an epoch, 3
# epochs at 24, 28 and 32 px; evaluation and the export at 40 px.
TECHNIQUES = [
    '--resnet_depth=10', '--width_multiplier=0.25', '--stem=small',
    '--batch_size=4', '--steps_per_loop=2', '--log_steps=2',
    '--global_seed=5', '--enable_checkpoint_and_export',
    '--image_size=32', '--progressive_resize_start_size=24',
    '--progressive_resize_epochs=0,2', '--eval_image_size=40',
    '--zero_init_residual', '--blurpool', '--ema_decay=0.8', '--ema_warmup',
    '--eval_flip', '--lr_schedule=linear', '--lr_per_epoch',
    '--warmup_epochs=1', '--label_smoothing=0.1', '--stem_init=pca',
    '--randaugment=rand-m9-n2-mstd0.5-inc1', '--random_erasing=0.5',
    '--repeated_augmentation=2', '--mixup_alpha=0.2', '--cutmix_alpha=1.0',
    '--drop_path_rate=0.1', '--optimizer=LAMB', '--clip_grad_norm=1',
    '--loss=bce', '--bce_target_threshold=0.2']


@dataclasses.dataclass
class Result:
  """What an in-process run left: as a subprocess.CompletedProcess."""
  returncode: int
  stdout: str
  stderr: str


@contextlib.contextmanager
def _captured_logs(stream):
  """absl's log lines (ours and orbit's) at INFO, formatted as the entry
  points format them, into `stream` only."""
  logger = logging.get_absl_logger()
  handler = py_logging.StreamHandler(stream)
  handler.setFormatter(cli.log_formatter())
  saved = logger.level, logger.propagate
  logger.addHandler(handler)
  logger.setLevel(py_logging.INFO)
  logger.propagate = False
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.level, logger.propagate = saved


def reset_tensorflow_state(log_level=py_logging.WARNING):
  """Undoes what a run changes process-wide and a new interpreter would not
  have: the Keras session, the precision policy, TensorFlow's Python log
  level (to `log_level`). After every in-process entry point (`call`), and
  after each test that uses the fresh_tensorflow_state fixture."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  tf_keras.backend.clear_session()
  tf_keras.mixed_precision.set_global_policy('float32')
  tf.get_logger().setLevel(log_level)


def call(module, args: Sequence[str],
         env: Optional[Mapping[str, str]] = None) -> Result:
  """Runs entry point `module` (its `main`, and `define_flags` if it has
  flags) with `args` in this process; `env` adds to os.environ meanwhile."""
  values = flags.FlagValues()
  if hasattr(module, 'define_flags'):
    module.define_flags(values)
  stdout, stderr = io.StringIO(), io.StringIO()
  try:
    with mock.patch.object(flags, 'FLAGS', values), \
        mock.patch.object(sys, 'argv', [module.__file__] + list(args)), \
        mock.patch.dict(os.environ, env or {}), \
        contextlib.redirect_stdout(stdout), \
        contextlib.redirect_stderr(stderr), _captured_logs(stderr):
      try:
        argv = cli.parse_flags_or_fail([module.__file__] + list(args))
        cli.run_main(module.main, argv)
        returncode = 0
      except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
          returncode = e.code or 0
        else:  # sys.exit('message'), as Python reports it.
          print(e.code, file=sys.stderr)
          returncode = 1
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()  # What the interpreter would print.
        returncode = 1
  finally:
    reset_tensorflow_state()
  return Result(returncode, stdout.getvalue(), stderr.getvalue())


def run_main(args: Sequence[str], **kwargs) -> Result:
  """resnet_ctl_imagenet_main.py `args`, in this process."""
  return call(importlib.import_module('resnet_ctl_imagenet_main'), args,
              **kwargs)


def run_tool(module: str, args: Sequence[str], **kwargs) -> Result:
  """`python -m module args` (as the README runs the tools), in this
  process."""
  return call(importlib.import_module(module), args, **kwargs)


def _spawn(argv, timeout=600, env=None, replace_env=False):
  """`env` adds to this process's environment, or replaces it; `timeout`
  (a quiet machine's bound) stretched to this machine's measured pace, as
  the test's own limit is (a loaded machine ran a 300 s bound out)."""
  full_env = {} if replace_env else dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([sys.executable] + list(argv), cwd=REPO_ROOT,
                        capture_output=True, text=True,
                        timeout=deadlines.stretched(timeout), env=full_env)


def spawn_script(script, args, **kwargs):
  """Runs `script args` with this Python; returns the CompletedProcess."""
  return _spawn([script] + list(args), **kwargs)


def spawn_main(args, **kwargs):
  return spawn_script(MAIN, args, **kwargs)


def spawn_tool(module, args, **kwargs):
  """Runs `python -m module args`, as the README documents the tools."""
  return _spawn(['-m', module] + list(args), **kwargs)


def train_tiny(model_dir, args=tuple(TINY)):
  """Two epochs of `args` with checkpoints (ckpt-4, ckpt-8) and an export."""
  result = run_main(list(args) + ['-md', str(model_dir), '-te', '2',
                                  '--enable_checkpoint_and_export'])
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def read_summary(model_dir):
  with open(os.path.join(model_dir, 'run_summary.json')) as f:
    return json.load(f)


def checkpoint_steps(model_dir):
  """The steps of the checkpoints in `model_dir`, ascending."""
  return sorted(int(p.rsplit('-', 1)[1].split('.')[0])
                for p in glob.glob(os.path.join(model_dir, 'ckpt-*.index')))


def checkpoint_values(path, keep=lambda name: True):
  """Key -> value of the variables of the checkpoint `path` (a prefix such
  as DIR/ckpt-8) whose key `keep` accepts."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map() if keep(name)}


def model_weights(path):
  """The network's own variables in the checkpoint `path`, by key: not
  the optimizer's slots, the weight average or the step."""
  return checkpoint_values(
      path, lambda name: name.startswith('model/') and
      'OPTIMIZER_SLOT' not in name)


def copy_run_up_to(model_dir, step, into):
  """A new model_dir `into` holding `model_dir`'s run as it stood at its
  checkpoint at `step` (that checkpoint, config.json, world_sizes.json): a
  resume from it is a resume of the run interrupted there, without training
  the first part again."""
  os.makedirs(into)
  for name in os.listdir(model_dir):
    if name.startswith(f'ckpt-{step}.') or name in ('config.json',
                                                  'world_sizes.json'):
      shutil.copy(os.path.join(model_dir, name), into)
  with open(os.path.join(into, 'checkpoint'), 'w') as f:
    f.write(f'model_checkpoint_path: "ckpt-{step}"\n'
            f'all_model_checkpoint_paths: "ckpt-{step}"\n')


def assert_one_line_error(result, *fragments):
  """Non-zero exit, one 'error:' line on stderr naming what to fix."""
  assert result.returncode != 0, result.stdout + result.stderr
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('error: '), result.stderr
  assert 'Traceback' not in result.stderr + result.stdout
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def assert_stopped_with(result, *fragments):
  """A run that stopped mid-training: its last stderr line is the error."""
  assert result.returncode != 0, result.stdout + result.stderr
  assert 'Traceback' not in result.stderr + result.stdout
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: '), result.stderr
  for fragment in fragments:
    assert fragment in last, last
