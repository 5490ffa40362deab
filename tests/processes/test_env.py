"""The process environment TensorFlow reads when it loads: runs in a fresh
process record whether oneDNN was on, and why. (common/env.py alone:
unit/.)"""

import json

import pytest

from common import env
from tests.support import runner


@pytest.mark.parametrize('value,on', [(None, True), ('0', False)])
def test_runs_record_whether_onednn_was_on_and_why(tmp_path, value, on):
  extra = {} if value is None else {env.ONEDNN_VAR: value}
  environ = dict(env.os.environ)
  for name in (env.ONEDNN_VAR, env.ONEDNN_DEFAULTED_VAR):
    environ.pop(name, None)
  environ.update(extra)
  model_dir = tmp_path / 'model'
  # A process of its own: TensorFlow reads the variable when it loads.
  result = runner.spawn_main(
      runner.TINY + ['--skip_eval', '--dtype=auto', f'--model_dir={model_dir}'],
      env=environ, replace_env=True)
  assert result.returncode == 0, result.stderr[-3000:]
  runtime = runner.read_summary(model_dir)['runtime']
  assert runtime['onednn'] is on
  assert ('set by resnet_keras' if value is None else
          'TF_ENABLE_ONEDNN_OPTS=0 set in the environment'
          ) in runtime['onednn_reason']
  recorded = json.loads((model_dir / 'config.json').read_text())
  assert recorded['runtime'] == runtime
  # auto was decided: the config holds what ran, the log line says why.
  assert recorded['config']['dtype'] == runtime['dtype'] != 'auto'
  assert f'dtype {runtime["dtype"]} (auto: ' in result.stderr
