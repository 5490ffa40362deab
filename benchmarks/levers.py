"""One lever at a time: our trainer with and without it, run alternately.

Each lever is a pair of settings (flags and environment) of
`resnet_ctl_imagenet_main.py` on synthetic ResNet-50 data; both sides run
alternately (A B A B ...) so machine noise hits them alike. Prints steady
img/s (first loop dropped) per side and the ratio.

  python -m benchmarks.levers                       # every lever
  python -m benchmarks.levers --levers conv_impl --batch 32 --dtype bf16
  python -m benchmarks.levers --levers bf16 --batch 128 \
      --model_flags='--resnet_depth=18 --stem=small --image_size=28'
"""

import argparse
import glob
import statistics

from benchmarks import hardware
from benchmarks.compare_upstream import run_once

_ALLOCATOR_GLOBS = {
    'tcmalloc': '/usr/lib/*/libtcmalloc_minimal.so.4',
    'jemalloc': '/usr/lib/*/libjemalloc.so.2',
}


def _preload(name):
  found = glob.glob(_ALLOCATOR_GLOBS[name])
  return {'LD_PRELOAD': found[0]} if found else None


# name -> (baseline, variant); each side is (label, extra flags, extra env).
LEVERS = {
    'conv_impl': (('native', ['--conv_impl=native'], {}),
                  ('matmul', ['--conv_impl=matmul'], {})),
    'relu_impl': (('native', ['--relu_impl=native'], {}),
                  ('bitwise', ['--relu_impl=bitwise'], {})),
    'relu_impl_xla': (('bitwise', ['--relu_impl=bitwise'], {}),
                      ('xla', ['--relu_impl=xla'], {})),
    'relu_native_xla': (('native', ['--relu_impl=native'], {}),
                        ('xla', ['--relu_impl=xla'], {})),
    # bf16 where the CPU has no bf16 hardware is emulated: how much slower.
    'bf16': (('fp32', ['--dtype=fp32'], {}), ('bf16', ['--dtype=bf16'], {})),
    'inter_op_threads': (('default', [], {}),
                         ('1', ['--inter_op_parallelism_threads=1'], {})),
    'tcmalloc': (('glibc malloc', [], {}),
                 ('tcmalloc', [], _preload('tcmalloc'))),
    'jemalloc': (('glibc malloc', [], {}),
                 ('jemalloc', [], _preload('jemalloc'))),
    'onednn': (('oneDNN on', [], {}),
               ('oneDNN off', [], {'TF_ENABLE_ONEDNN_OPTS': '0'})),
    # fp32 variables and activations, bf16 multiplies inside oneDNN convs
    # (like TF32 on GPUs, with fewer mantissa bits): run with --dtype fp32.
    'fp32_bf16_math': (('strict fp32', [], {}),
                       ('bf16 math', [],
                        {'ONEDNN_DEFAULT_FPMATH_MODE': 'BF16'})),
    'steps_per_loop': (('1 step/loop', ['--steps_per_loop=1'], {}),
                       ('default', [], {})),
    # The thread that calls a oneDNN op also runs a share of it, instead of
    # waiting for the pool's threads.
    'onednn_caller_thread': (('pool only', [], {}),
                             ('caller joins', [], {
                                 'TF_ONEDNN_THREADPOOL_USE_CALLER_THREAD':
                                     '1'})),
    # oneDNN's scratch and workspace memory from malloc instead of
    # TensorFlow's CPU allocator.
    'onednn_system_allocator': (('TF allocator', [], {}),
                                ('system malloc', [], {
                                    'TF_ONEDNN_USE_SYSTEM_ALLOCATOR': '1'})),
    # TensorFlow's oneDNN ops keep their primitives' memory between calls
    # instead of freeing it after each one.
    'onednn_keep_primitive_memory': (('default', [], {}),
                                     ('kept', [], {
                                         'TF_MKL_OPTIMIZE_PRIMITIVE_MEMUSE':
                                             'false'})),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--levers', default=','.join(LEVERS))
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--dtype', default='bf16')
  parser.add_argument('--repeats', type=int, default=2,
                      help='A/B pairs per lever.')
  parser.add_argument('--loops', type=int, default=4,
                      help='Loops per run (the first is dropped).')
  parser.add_argument('--steps_per_loop', type=int, default=4)
  parser.add_argument('--model_flags', default='',
                      help='Trainer flags for another model than ResNet-50 '
                      'at 224 (space-separated).')
  args = parser.parse_args()
  model_flags = args.model_flags.split()
  steps = args.loops * args.steps_per_loop
  print(hardware.machine_line())
  print(f'{args.model_flags or "ResNet-50"} synthetic, batch {args.batch}, '
        f'{args.dtype}, {steps} steps per run, median of {args.repeats} '
        'alternating runs')
  print(f'{"lever":<28} {"before":<14} {"img/s":>7} {"after":<14} '
        f'{"img/s":>7} {"ratio":>6}', flush=True)
  for name in args.levers.split(','):
    sides = LEVERS[name]
    if any(env is None for _, _, env in sides):
      print(f'{name:<28} not installed on this machine ({name})', flush=True)
      continue
    rates = [[], []]
    for _ in range(args.repeats):
      for i, (_, flags, env) in enumerate(sides):
        rates[i].append(run_once('ours', args.batch, args.dtype, steps,
                                 args.steps_per_loop, model_flags + flags,
                                 env))
    (before, _, _), (after, _, _) = sides
    a, b = statistics.median(rates[0]), statistics.median(rates[1])
    print(f'{name:<28} {before:<14} {a:>7.2f} {after:<14} {b:>7.2f} '
          f'{b / a:>6.2f}', flush=True)


if __name__ == '__main__':
  main()
