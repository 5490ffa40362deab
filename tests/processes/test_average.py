"""python -m resnet_keras.average --help, as a fresh interpreter prints it."""

from tests.support import runner


def test_help_lists_the_flags():
  result = runner.spawn_tool('resnet_keras.average',
                             ['--model_dir', 'unused', '--help'], timeout=120)
  assert result.returncode == 0
  for flag in ('--model_dir', '--last', '--ema', '--output_dir', '--export'):
    assert flag in result.stdout
