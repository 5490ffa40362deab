"""Train a tiny ResNet by calling the library, then read the run back.

  python -m examples.train_as_a_library [MODEL_DIR]   # from the repository's root
  python examples/train_as_a_library.py [MODEL_DIR]   # after pip install .

The library takes a RunConfig (resnet_keras/config/), the record the
trainer's flags are parsed into: every flag is a field of the same name,
with the same default and checks. `run.run` trains and evaluates as the
config says and writes the run directory (config.json, metrics.jsonl,
checkpoints when asked, run_summary.json). Here: ResNet-10 at a quarter of
its width on 32x32 synthetic images, 4 steps of 8 images, a few seconds on
a CPU; the data are random, so the accuracy means nothing. MODEL_DIR
defaults to a new temporary directory.
"""

import json
import os
import sys
import tempfile

from common import env

# As in every entry point: tf_keras as Keras, oneDNN on x86-64 CPUs, quiet
# C++ logs. It sets environment variables that TensorFlow reads only when it
# loads, so it comes before anything imports TensorFlow.
env.prepare_tensorflow_environment()

from absl import logging  # pylint: disable=g-import-not-at-top

from common import cli  # pylint: disable=g-import-not-at-top
from resnet_keras.training import run  # pylint: disable=g-import-not-at-top
from resnet_keras.config import RunConfig  # pylint: disable=g-import-not-at-top


def tiny_config(model_dir: str) -> RunConfig:
  """The run: every field not given keeps the trainer's default."""
  return RunConfig(
      model_dir=model_dir,
      clean=True,  # Start over if MODEL_DIR holds an earlier run.
      use_synthetic_data=True, num_classes=10, image_size=32,
      resnet_depth=10, width_multiplier=0.25,
      batch_size=8, train_steps=4, steps_per_loop=2, log_steps=2,
      num_eval_examples=16,
      plots=False)  # No plots/: saves matplotlib's import and drawing.


def main(model_dir: str) -> dict:
  """Trains the tiny run in `model_dir`; returns its run_summary.json."""
  cfg = tiny_config(model_dir)
  cfg.check()  # Bad values raise UsageError in one line (run.run checks too).
  run.run(cfg)
  # What the run left: run.run also returns this summary; read back from
  # the run directory here, as another program (or a later one) would.
  with open(os.path.join(model_dir, 'run_summary.json')) as f:
    summary = json.load(f)
  # train_loss is the last step's (a log line's is the mean since the last).
  print(f'{model_dir}: {summary["train_steps"]} steps of '
        f'{summary["global_batch_size"]} images, last training loss '
        f'{summary["train_loss"]:.4f}, eval accuracy '
        f'{summary["eval_accuracy"]:.3f} on {summary["eval_examples"]} '
        f'images, {summary["avg_exp_per_second"]:.0f} img/s')
  return summary


if __name__ == '__main__':
  # The trainer's log lines at INFO, formatted as the entry points do.
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  cli.configure_logging()
  main(sys.argv[1] if len(sys.argv) > 1 else
       tempfile.mkdtemp(prefix='resnet_keras_example_'))
