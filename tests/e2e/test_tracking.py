"""--wandb in a whole run: metrics.jsonl's records and the config in a W&B
run (offline), and a missing package. (The
tracking module alone: unit/.)"""

import glob
import json
import os
import sys

import pytest

from resnet_keras.engine import metrics
from tests.support import runner


def _offline_env(tmp_path):
  """No W&B login (an empty netrc, no key), W&B's own files under tmp_path."""
  (tmp_path / 'netrc').write_text('')
  return {'NETRC': str(tmp_path / 'netrc'), 'WANDB_API_KEY': '',
          'WANDB_CONFIG_DIR': str(tmp_path / 'config'),
          'WANDB_CACHE_DIR': str(tmp_path / 'cache'),
          'WANDB_DATA_DIR': str(tmp_path / 'data')}


def _wandb_log(run_dir):
  """(config, history rows) stored in an offline run's .wandb file."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  from wandb.sdk.internal import datastore  # pylint: disable=g-import-not-at-top
  (path,) = glob.glob(os.path.join(run_dir, 'run-*.wandb'))
  store = datastore.DataStore()
  store.open_for_scan(path)
  key = lambda item: item.key or '/'.join(item.nested_key)
  config, rows = None, []
  while (data := store.scan_data()) is not None:
    record = wandb_internal_pb2.Record()
    record.ParseFromString(data)
    kind = record.WhichOneof('record_type')
    if kind == 'run':
      config = {key(i): json.loads(i.value_json)
                for i in record.run.config.update}
      name, project = record.run.display_name, record.run.project
    elif kind == 'history':
      rows.append({key(i): json.loads(i.value_json)
                   for i in record.history.item if not key(i).startswith('_')})
  return config, rows, name, project


@pytest.mark.slow
def test_offline_run_logs_the_metrics_log_and_config(tmp_path):
  # requirements-test.txt (installed by scripts/test.sh) provides it: a
  # missing wandb fails here rather than skipping the test.
  import wandb  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / 'model'
  try:
    result = runner.run_main(
        runner.TINY + ['-md', str(model_dir), '--wandb', '--wandb_project',
                       'tiny', '--wandb_run_name', 'first'],
        env=_offline_env(tmp_path))
    # The run finished its W&B run (the tiny recipe draws no plots: that
    # must not keep it open).
    assert wandb.run is None
  finally:
    # wandb's service process serves this interpreter until torn down.
    wandb.teardown()
  assert result.returncode == 0, result.stderr[-3000:]
  assert '--wandb: offline, not logged in' in result.stderr
  (run_dir,) = glob.glob(str(model_dir / 'wandb' / 'offline-run-*'))
  config, rows, name, project = _wandb_log(run_dir)
  assert (name, project) == ('first', 'tiny')
  assert rows == metrics.read_metrics_log(str(model_dir))
  assert {'train_loss', 'eval_accuracy'} <= set().union(*rows)
  assert config['num_classes'] == 10 and config['wandb'] is True
  assert config['model_dir'] == str(model_dir)
  assert config['training_plan']['steps_per_epoch'] == 4


def test_a_missing_package_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # As if not installed.
  result = runner.run_main(runner.TINY + ['-md', str(tmp_path / 'm'),
                                          '--wandb'])
  runner.assert_one_line_error(result, '--wandb needs the wandb package',
                               'pip install wandb')
