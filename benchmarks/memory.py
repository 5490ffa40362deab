"""Resident memory of a training run: peak, and whether it grows.

Runs `resnet_ctl_imagenet_main.py` on synthetic data, samples the process's
RSS (/proc/PID/status) at every step log line, and prints RSS against step
plus the growth after warm-up (MiB per 100 steps, fitted over the second
half of the run). A leak shows as a steady positive slope.

  python -m benchmarks.memory                      # 1000 steps, 64 px
  python -m benchmarks.memory --steps 40 --image_size 224 --batch 32 --log_steps 4
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import hardware

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_LINE = re.compile(r'step (\d+)/\d+ \|')


def rss_mib(pid: int) -> float:
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f'no VmRSS for pid {pid}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=1000)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--image_size', type=int, default=64)
  parser.add_argument('--dtype', default='bf16')
  parser.add_argument('--resnet_depth', type=int, default=50)
  parser.add_argument('--log_steps', type=int, default=50)
  args = parser.parse_args()
  print(hardware.machine_line())
  with tempfile.TemporaryDirectory() as model_dir:
    command = [
        sys.executable, os.path.join(REPO_ROOT, 'resnet_ctl_imagenet_main.py'),
        '--use_synthetic_data', '--skip_eval', f'--train_steps={args.steps}',
        f'--batch_size={args.batch}', f'--image_size={args.image_size}',
        f'--dtype={args.dtype}', f'--resnet_depth={args.resnet_depth}',
        f'--steps_per_loop={args.log_steps}', f'--log_steps={args.log_steps}',
        f'--model_dir={model_dir}',
        # The model_dir is deleted unread; plots would only add their
        # drawing after the last step.
        '--noplots']
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    samples = []
    for line in proc.stdout:
      match = STEP_LINE.search(line)
      if match:
        samples.append((int(match.group(1)), rss_mib(proc.pid)))
    if proc.wait():
      sys.exit(f'training failed with exit code {proc.returncode}')
  print(f'ResNet-{args.resnet_depth} {args.dtype} batch {args.batch} at '
        f'{args.image_size} px, synthetic data')
  print(f'{"step":>6} {"RSS MiB":>8}')
  for step, rss in samples:
    print(f'{step:>6} {rss:>8.0f}')
  steps, rss = np.array(samples).T
  half = len(steps) // 2
  if len(steps) - half >= 2:
    slope = np.polyfit(steps[half:], rss[half:], 1)[0] * 100
    print(f'growth after warm-up: {slope:+.2f} MiB per 100 steps '
          f'(steps {int(steps[half])}-{int(steps[-1])})')
  print(f'peak sampled RSS: {rss.max():.0f} MiB')


if __name__ == '__main__':
  main()
