"""Helpers for end-to-end tests that run the real entry points."""

import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(REPO_ROOT, 'resnet_ctl_imagenet_main.py')

# A small, fast run: ResNet-18 on 32x32 synthetic images.
TINY = ['--use_synthetic_data', '--resnet_depth=18', '--image_size=32',
        '--num_classes=10', '--batch_size=8', '--train_steps=4',
        '--steps_per_loop=2', '--log_steps=2', '--num_eval_examples=13']


def _run(argv, timeout=600, env=None, replace_env=False):
  """`env` adds to this process's environment, or replaces it."""
  full_env = {} if replace_env else dict(os.environ)
  full_env.update(env or {})
  return subprocess.run([sys.executable] + list(argv), cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=timeout,
                        env=full_env)


def run_script(script, args, **kwargs):
  """Runs `script args` with this Python; returns the CompletedProcess."""
  return _run([script] + list(args), **kwargs)


def run_main(args, **kwargs):
  return run_script(MAIN, args, **kwargs)


def run_tool(module, args, **kwargs):
  """Runs `python -m module args`, as the README documents the tools."""
  return _run(['-m', module] + list(args), **kwargs)


def train_tiny(model_dir, args=tuple(TINY)):
  """Two epochs of `args` with checkpoints (ckpt-4, ckpt-8) and an export."""
  result = run_main(list(args) + ['-md', str(model_dir), '-te', '2',
                                  '--enable_checkpoint_and_export'])
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def read_summary(model_dir):
  with open(os.path.join(model_dir, 'run_summary.json')) as f:
    return json.load(f)


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
