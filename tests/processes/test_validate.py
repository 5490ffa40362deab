"""python -m resnet_keras.validate --help, as a fresh interpreter prints it."""

from tests.support import runner


def test_help_lists_the_flags():
  result = runner.spawn_tool('resnet_keras.validate',
                             ['--model_dir', 'unused', '--help'], timeout=120)
  assert result.returncode == 0
  for flag in ('--model_dir', '--checkpoint', '--data_dir'):
    assert flag in result.stdout
