"""preprocess_imagenet.py's usage errors, as a fresh interpreter reports
them: exit code 2 and one line (a tiny raw tree: support/converter.py)."""

import pytest

from tests.support.converter import assert_one_line_error, make_raw, run_script


@pytest.mark.parametrize('args,fragment', [
    (['--raw_data_dir', '/nonexistent/raw'], '/nonexistent/raw'),
    (['--raw_data_dir', '{raw}', '--train_shards', '0'],
     '--train_shards must be at least 1'),
    (['--raw_data_dir', '{raw}', '--num_workers', 'two'], 'num_workers'),
    (['--raw_data_dir', '{raw}', 'extra'], 'unexpected arguments extra'),
    (['--raw_data_dir', '{raw}', '--gcs_upload'], 'gsutil'),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, fragment):
  raw = make_raw(str(tmp_path))
  args = [a.format(raw=raw) for a in args]
  result = run_script(*args, '--local_scratch_dir', str(tmp_path / 'out'))
  assert_one_line_error(result, fragment)
