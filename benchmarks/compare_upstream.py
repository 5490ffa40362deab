"""This project's trainer vs the Model Garden's, on the same synthetic data.

Runs `resnet_ctl_imagenet_main.py` (ours) and
`official.legacy.image_classification.resnet.resnet_ctl_imagenet_main`
(upstream, shipped in tf-models-official) alternately (A B A B ...) for each
batch size and dtype, with the defaults a user gets. Upstream runs twice:
as a user gets it (TensorFlow's default oneDNN setting: off on x86 CPUs
without AVX512_VNNI, AVX512_BF16 or AMX) and with oneDNN on (like for like:
ours turns it on everywhere). Throughput is the
steady state: each program reports examples/sec per `steps_per_loop` interval
and the first interval (tracing, warm-up) is dropped. Prints the median per
program, the ratio ours/upstream, and our model FLOP utilisation: achieved
training FLOP/s over this machine's matmul peak in that dtype, measured at
the start of the same run (benchmarks/hardware.py).

  python -m benchmarks.compare_upstream --batch_sizes 16,32 --dtypes fp32,bf16
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from benchmarks import hardware

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS_RATE = re.compile(r'\| ([\d.]+) examples/sec')
UPSTREAM_RATE = re.compile(r'TimeHistory: [\d.]+ seconds, ([\d.]+) '
                           r'examples/second')


def _command(program, batch, dtype, steps, steps_per_loop, model_dir):
  common = [f'--batch_size={batch}', f'--dtype={dtype}', '--skip_eval',
            '--use_synthetic_data', f'--train_steps={steps}',
            f'--steps_per_loop={steps_per_loop}',
            f'--log_steps={steps_per_loop}', f'--model_dir={model_dir}',
            '--train_epochs=1']
  if program == 'ours':
    # No plots: the model_dir is deleted unread, and drawing them took 3 s
    # of a tiny run's 17 s of CPU.
    return [sys.executable, os.path.join(REPO_ROOT,
                                         'resnet_ctl_imagenet_main.py'),
            '--noplots'] + common
  return [sys.executable, '-m',
          'official.legacy.image_classification.resnet.resnet_ctl_imagenet_main',
          '--distribution_strategy=off', '--num_gpus=0', '--clean'] + common


def steady_rate(program, output):
  """Median examples/sec over the intervals after the first."""
  pattern = OURS_RATE if program == 'ours' else UPSTREAM_RATE
  rates = [float(r) for r in pattern.findall(output)]
  if len(rates) < 2:
    raise RuntimeError(f'{program}: fewer than 2 intervals logged:\n'
                       f'{output[-3000:]}')
  return statistics.median(rates[1:])


def run_once(program, batch, dtype, steps, steps_per_loop, extra_args=(),
             extra_env=None):
  """Steady-state examples/sec of one run of `program` ('ours'/'upstream').

  The environment is this shell's as a user has it (without what
  hardware.py's import set for this process), plus `extra_env`.
  """
  env = {k: v for k, v in os.environ.items()
         if (k, v) not in hardware.SET_BY_US.items()}
  env.update(TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='3')
  env.update(extra_env or {})
  with tempfile.TemporaryDirectory() as model_dir:
    result = subprocess.run(
        _command(program, batch, dtype, steps, steps_per_loop, model_dir) +
        list(extra_args), cwd=REPO_ROOT, capture_output=True, text=True,
        env=env)
  if result.returncode:
    raise RuntimeError(f'{program} failed:\n{result.stderr[-3000:]}')
  return steady_rate(program, result.stdout + result.stderr)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch_sizes', default='16,32')
  parser.add_argument('--dtypes', default='fp32,bf16')
  parser.add_argument('--repeats', type=int, default=2,
                      help='A/B pairs per cell.')
  parser.add_argument('--loops', type=int, default=4,
                      help='Loops per run (the first is dropped).')
  parser.add_argument('--steps_per_loop', type=int, default=4)
  args = parser.parse_args()
  steps = args.loops * args.steps_per_loop
  dtypes = args.dtypes.split(',')
  print(hardware.machine_line())
  peaks = {d: hardware.matmul_peak_gflops(d) for d in dtypes}
  print('matmul peak: ' + ', '.join(f'{d} {p:.0f} GFLOP/s'
                                    for d, p in peaks.items()))
  flop = hardware.resnet50_train_gflop_per_image()
  print(f'{"batch":>5} {"dtype":>5} {"ours img/s":>11} {"upstream":>9} '
        f'{"ratio":>6} {"+oneDNN":>8} {"ratio":>6} {"MFU":>5}   (median of '
        f'{args.repeats} alternating runs, {steps} steps each)', flush=True)
  sides = (('ours', 'ours', None), ('upstream', 'upstream', None),
           ('upstream+oneDNN', 'upstream', {'TF_ENABLE_ONEDNN_OPTS': '1'}))
  for batch in [int(b) for b in args.batch_sizes.split(',')]:
    for dtype in dtypes:
      rates = {name: [] for name, _, _ in sides}
      for _ in range(args.repeats):
        for name, program, extra_env in sides:
          rates[name].append(run_once(program, batch, dtype, steps,
                                      args.steps_per_loop,
                                      extra_env=extra_env))
      ours, upstream, onednn = (statistics.median(rates[name])
                                for name, _, _ in sides)
      mfu = ours * flop / peaks[dtype]
      print(f'{batch:>5} {dtype:>5} {ours:>11.2f} {upstream:>9.2f} '
            f'{ours / upstream:>6.2f} {onednn:>8.2f} {ours / onednn:>6.2f} '
            f'{mfu:>5.0%}   {rates}', flush=True)


if __name__ == '__main__':
  main()
