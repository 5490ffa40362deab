"""The fastest a ResNet-50 training step can run on this machine, vs ours.

A roofline model of one training step, built from the real model's layer
shapes (`resnet_keras.model.network.resnet`) and two limits measured in the same
run (hardware.py): the matmul peak in the step's dtype and the memory
bandwidth TensorFlow's elementwise kernels reach (adds on 1 GiB tensors).
Every op of the step (forward, both gradients of each convolution, batch
norm, ReLU and its gradient, residual adds and the gradient sums where a
tensor feeds two layers, pooling, weight casts under mixed precision, weight
decay, the momentum update) moves at least its inputs and outputs once and
does its FLOPs, so it takes at least max(FLOPs / peak, bytes / bandwidth).
Two ceilings follow:

- serial: those per-op times summed. TensorFlow runs the step as separate
  kernels, each using both cores; this is that execution at each kernel's
  own limit. Only batch norm + ReLU is counted fused, as oneDNN fuses it.
- overlapped: max(all FLOPs / peak, all bytes / bandwidth), as if memory
  traffic hid entirely under the matmuls (kernels fused across ops, which
  TensorFlow does not do on CPUs).

Then our trainer runs on synthetic data (compare_upstream.run_once) and the
script prints its img/s as a fraction of each ceiling.

  python -m benchmarks.roofline [--batch 16] [--dtype bf16] [--no_measure]
"""

import argparse
import collections


from common import env  # pylint: disable=g-import-not-at-top

env.prepare_tensorflow_environment()

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top

from benchmarks import hardware  # pylint: disable=g-import-not-at-top
from resnet_keras.model import layers  # pylint: disable=g-import-not-at-top
from resnet_keras.model import network as network_lib  # pylint: disable=g-import-not-at-top

VARIABLE_BYTES = 4  # float32 variables, gradients and momentum.
# Bytes per parameter per step outside the layers: SGD momentum reads the
# variable, gradient and momentum and writes two; an L2 regulariser's
# gradient reads the variable and gradient and writes the gradient; under
# mixed precision the variable is cast to the compute dtype and its
# gradient back.
MOMENTUM_BYTES = 5 * VARIABLE_BYTES
WEIGHT_DECAY_BYTES = 3 * VARIABLE_BYTES


Cost = collections.namedtuple('Cost', 'kind flop bytes')


def _elements(shape, batch):
  return batch * int(np.prod(shape[1:]))


def _producer(tensor):
  return tensor._keras_history.layer  # pylint: disable=protected-access


def step_costs(model, batch, act_bytes, mixed_precision, weight_decay=True):
  """Cost per op of one training step of `model` at `batch`.

  Kinds name what the bytes and FLOPs belong to, for the breakdown.
  """
  costs = []
  consumers = collections.Counter()
  for layer in model.layers:
    for node in layer._inbound_nodes:  # pylint: disable=protected-access
      for tensor in tf.nest.flatten(node.keras_inputs):
        consumers[id(tensor)] += 1
  for layer in model.layers:
    if isinstance(layer, tf_keras.layers.InputLayer):
      continue
    node = layer._inbound_nodes[0]  # pylint: disable=protected-access
    inputs = tf.nest.flatten(node.keras_inputs)
    in_bytes = sum(_elements(t.shape, batch) for t in inputs) * act_bytes
    out_bytes = _elements(layer.output.shape, batch) * act_bytes
    if isinstance(layer, (tf_keras.layers.Conv2D, tf_keras.layers.Dense)):
      kernel = layer.kernel.shape
      macs = int(np.prod(kernel)) * _elements(layer.output.shape, batch) // (
          kernel[-1])
      weights = int(np.prod(kernel)) * act_bytes
      # The image needs no gradient: the stem has no input-gradient op.
      first = isinstance(_producer(inputs[0]), tf_keras.layers.InputLayer)
      passes = 2 if first else 3
      costs.append(Cost('conv/dense', passes * 2 * macs,
                        passes * (in_bytes + out_bytes + weights)))
    elif isinstance(layer, tf_keras.layers.BatchNormalization):
      # Forward: statistics, then normalise (3 passes); backward: two
      # reductions over x and dy, then dx (5 passes).
      costs.append(Cost('batch norm', 0, 8 * out_bytes))
    elif isinstance(layer, (tf_keras.layers.Activation, layers.ResidualRelu)):
      # oneDNN fuses a ReLU into the batch norm before it (forward only);
      # the others read and write once, and every gradient reads dy and y.
      fused = isinstance(_producer(inputs[0]),
                         tf_keras.layers.BatchNormalization)
      costs.append(Cost('relu/softmax', 0,
                        (0 if fused else 2 * out_bytes) + 3 * out_bytes))
    elif isinstance(layer, tf_keras.layers.Add):
      costs.append(Cost('residual add', 0, in_bytes + out_bytes))
    elif isinstance(layer, tf_keras.layers.MaxPooling2D):
      # Backward reads the input, output and dy to route dy to each max.
      costs.append(Cost('pooling', 0, 3 * in_bytes + 3 * out_bytes))
    elif isinstance(layer, tf_keras.layers.GlobalAveragePooling2D):
      costs.append(Cost('pooling', 0, 2 * in_bytes))
    else:
      raise ValueError(f'no cost model for layer {layer.name} '
                       f'({type(layer).__name__})')
    # Gradients of a tensor that feeds n layers are summed (AddN).
    readers = consumers[id(layer.output)]
    if readers > 1:
      costs.append(Cost('gradient sums', 0, (readers + 1) * out_bytes))
  params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  per_param = MOMENTUM_BYTES + (WEIGHT_DECAY_BYTES if weight_decay else 0)
  if mixed_precision:
    per_param += 2 * (VARIABLE_BYTES + act_bytes)
  costs.append(Cost('variables', 0, params * per_param))
  return costs


def ceilings(costs, peak_flops, bandwidth):
  """(serial seconds, overlapped seconds, seconds per kind) of one step."""
  per_kind = collections.Counter()
  for c in costs:
    per_kind[c.kind] += max(c.flop / peak_flops, c.bytes / bandwidth)
  serial = sum(per_kind.values())
  overlapped = max(sum(c.flop for c in costs) / peak_flops,
                   sum(c.bytes for c in costs) / bandwidth)
  return serial, overlapped, per_kind


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch', type=int, default=16)
  parser.add_argument('--dtype', default='bf16', choices=('bf16', 'fp32'))
  parser.add_argument('--no_measure', action='store_true',
                      help='Skip running our trainer; print the ceilings.')
  parser.add_argument('--loops', type=int, default=4,
                      help='Trainer loops (the first is dropped).')
  parser.add_argument('--steps_per_loop', type=int, default=4)
  hardware.add_size_arguments(parser)
  args = parser.parse_args()
  print(hardware.machine_line())
  peak = hardware.matmul_peak_gflops(args.dtype, args.matmul_size) * 1e9
  bandwidths = hardware.memory_bandwidth_gbs(args.bandwidth_elements)
  bandwidth = max(bandwidths.values()) * 1e9
  print(f'matmul peak {args.dtype} {peak / 1e9:.0f} GFLOP/s; memory '
        'bandwidth ' + ', '.join(f'{name} {rate:.1f}'
                                 for name, rate in bandwidths.items()) +
        ' GB/s')
  mixed = args.dtype == 'bf16'
  model = network_lib.resnet(50, 1000, 224)
  costs = step_costs(model, args.batch, 2 if mixed else 4, mixed)
  serial, overlapped, per_kind = ceilings(costs, peak, bandwidth)
  flop = sum(c.flop for c in costs)
  print(f'ResNet-50, batch {args.batch}, {args.dtype}: '
        f'{flop / args.batch / 1e9:.1f} GFLOP and '
        f'{sum(c.bytes for c in costs) / args.batch / 1e6:.0f} MB per image '
        'per training step')
  print('serial ceiling, ms per step by kind: ' + ', '.join(
      f'{kind} {seconds * 1e3:.0f}' for kind, seconds in
      sorted(per_kind.items(), key=lambda kv: -kv[1])))
  rows = [('serial ceiling', args.batch / serial),
          ('overlapped ceiling', args.batch / overlapped)]
  if not args.no_measure:
    from benchmarks.compare_upstream import run_once  # pylint: disable=g-import-not-at-top
    rows.append(('our trainer', run_once(
        'ours', args.batch, args.dtype, args.loops * args.steps_per_loop,
        args.steps_per_loop)))
  for name, rate in rows:
    mfu = rate * flop / args.batch / peak
    print(f'{name:<19} {rate:7.2f} img/s   MFU {mfu:4.0%}'
          + (f'   {rate / rows[0][1]:.0%} of serial, '
             f'{rate / rows[1][1]:.0%} of overlapped'
             if name == 'our trainer' else ''))


if __name__ == '__main__':
  main()
