"""PyTorch's training speed for the same ResNets, as the yardstick for ours.

Trains, on random data, the model our trainer builds for the same flags
(ResNet v1.5: stride on the bottleneck's 3x3; stems 'imagenet' 7x7/2 + max
pool, 'small' 3x3/1 + max pool, 'cifar' 3x3/1; --width_multiplier rounded
to multiples of 8 as channels.scaled_filters does) with SGD + momentum, weight
decay and label-smoothed cross entropy, in fp32, in PyTorch eager mode, and
with torch.compile; NCHW and channels_last. Prints img/s per mode: the
median over windows of --window steps, after a first window of warm-up (and
compilation) that is dropped.

PyTorch is no dependency of this project: run this with a Python that has it,
e.g. a venv with the CPU wheel (`pip install torch==2.13.0`; torchvision is
not needed, and its PyPI wheels are CUDA builds). Without it the script says
so in one line and exits 2.

  python -m benchmarks.pytorch_reference --depth 18 --stem small --image_size 28 --batch_size 128
  python -m benchmarks.pytorch_reference --depth 50 --image_size 224 --batch_size 16 --modes eager,compile

Compare with ours on the same machine, in the same quiet period, e.g.
  python resnet_ctl_imagenet_main.py --use_synthetic_data --resnet_depth 18 \\
      --stem small --image_size 28 --num_classes 10 --batch_size 128 --dtype fp32 \\
      --skip_eval --train_steps 60 --steps_per_loop 10 --log_steps 10
"""

import argparse
import statistics
import time

# All three are free of TensorFlow.
from common import cli
from resnet_keras.config.channels import STAGE_FILTERS, scaled_filters
from resnet_keras.config.hardware import this_cpu

BLOCKS = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3),
          50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
STEMS = {'imagenet': (7, 2, True), 'small': (3, 1, True),
         'cifar': (3, 1, False)}


def resnet(torch, depth, num_classes, stem, width_multiplier):
  """Our ResNet as a torch.nn.Sequential. `torch` is passed in, imported
  once the flags are parsed: --help and the missing-PyTorch error need
  none."""
  nn = torch.nn

  def conv_bn(cin, cout, kernel, stride, relu=True):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
              nn.BatchNorm2d(cout, eps=1e-5, momentum=0.1)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else (
        nn.Sequential(*layers))

  class Block(nn.Module):

    def __init__(self, cin, filters, stride, bottleneck):
      super().__init__()
      cout = filters * 4 if bottleneck else filters
      if bottleneck:
        self.body = nn.Sequential(conv_bn(cin, filters, 1, 1),
                                  conv_bn(filters, filters, 3, stride),
                                  conv_bn(filters, cout, 1, 1, relu=False))
      else:
        self.body = nn.Sequential(conv_bn(cin, filters, 3, stride),
                                  conv_bn(filters, filters, 3, 1, relu=False))
      self.shortcut = (conv_bn(cin, cout, 1, stride, relu=False)
                       if stride != 1 or cin != cout else nn.Identity())
      self.out_channels = cout

    def forward(self, x):
      return torch.relu(self.body(x) + self.shortcut(x))

  kernel, stride, pool = STEMS[stem]
  filters = scaled_filters(STAGE_FILTERS, width_multiplier)
  bottleneck = depth >= 50
  layers = [conv_bn(3, filters[0], kernel, stride)]
  if pool:
    layers.append(nn.MaxPool2d(3, 2, 1))
  cin = filters[0]
  for stage, (f, n) in enumerate(zip(filters, BLOCKS[depth])):
    for i in range(n):
      block = Block(cin, f, 2 if stage and not i else 1, bottleneck)
      layers.append(block)
      cin = block.out_channels
  layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
  return nn.Sequential(*layers)


def measure(torch, args, mode, channels_last):
  torch.manual_seed(0)
  model = resnet(torch, args.depth, args.num_classes, args.stem,
                 args.width_multiplier)
  images = torch.rand(args.batch_size, 3, args.image_size, args.image_size)
  labels = torch.randint(0, args.num_classes, (args.batch_size,))
  if channels_last:
    model = model.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                              weight_decay=1e-4)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss

  if mode == 'compile':
    step = torch.compile(step)
  model.train()
  rates = []
  for _ in range(args.windows + 1):
    start = time.perf_counter()
    for _ in range(args.window):
      loss = step()
    loss.item()
    rates.append(args.window * args.batch_size / (time.perf_counter() - start))
  return statistics.median(rates[1:]), rates


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--depth', type=int, default=18, choices=sorted(BLOCKS))
  parser.add_argument('--stem', default='small', choices=sorted(STEMS))
  parser.add_argument('--width_multiplier', type=float, default=1.0)
  parser.add_argument('--image_size', type=int, default=28)
  parser.add_argument('--num_classes', type=int, default=10)
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--window', type=int, default=5,
                      help='steps per timed window')
  parser.add_argument('--windows', type=int, default=4,
                      help='timed windows after the warm-up one')
  parser.add_argument('--modes', default='eager,compile',
                      help='comma-separated: eager, compile')
  parser.add_argument('--layouts', default='nchw,channels_last')
  args = parser.parse_args()
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    cli.fail('benchmarks.pytorch_reference needs PyTorch: '
             'pip install torch==2.13.0')
  print(f'machine: {this_cpu().describe()}; torch {torch.__version__}, '
        f'{torch.get_num_threads()} threads, oneDNN '
        f'{torch.backends.mkldnn.is_available()}')
  print(f'model: ResNet-{args.depth} stem {args.stem} width '
        f'{args.width_multiplier:g}, {args.image_size}px, batch '
        f'{args.batch_size}, fp32')
  for mode in args.modes.split(','):
    for layout in args.layouts.split(','):
      rate, rates = measure(torch, args, mode, layout == 'channels_last')
      print(f'{mode:8s} {layout:14s} {rate:8.2f} img/s  (windows: '
            f'{", ".join(f"{r:.1f}" for r in rates)})', flush=True)


if __name__ == '__main__':
  main()
