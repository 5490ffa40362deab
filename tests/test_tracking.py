"""--wandb: metrics.jsonl's records and the config in a W&B run (offline)."""

import glob
import json
import os
import sys

import pytest

from resnet_keras import metrics
from resnet_keras import tracking
from common.errors import UsageError
from tests import e2e


def test_offline_when_not_logged_in_or_unreachable(tmp_path):
  netrc = tmp_path / 'netrc'
  netrc.write_text('machine api.wandb.ai login user password KEY\n')
  up, down = (lambda host: True), (lambda host: False)
  assert 'not logged in' in tracking.offline_reason({'NETRC': '/nope'}, up)
  assert tracking.offline_reason({'NETRC': str(netrc)}, up) is None
  assert tracking.offline_reason({'WANDB_API_KEY': 'k'}, down) == (
      'api.wandb.ai is not reachable')
  other = {'WANDB_API_KEY': 'k', 'WANDB_BASE_URL': 'https://wandb.example'}
  assert tracking.offline_reason(other, down) == (
      'wandb.example is not reachable')
  assert 'not logged in' in tracking.offline_reason(
      {'NETRC': str(netrc), 'WANDB_BASE_URL': 'https://wandb.example'}, up)
  # The user's WANDB_MODE decides.
  assert tracking.offline_reason({'WANDB_MODE': 'online'}, down) is None


def test_missing_wandb_is_a_usage_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # import raises
  with pytest.raises(UsageError, match='pip install wandb'):
    tracking.import_wandb()


class _Recorder:

  def __init__(self):
    self.records, self.finished = [], False

  def log(self, record):
    self.records.append(record)

  def finish(self):
    self.finished = True


def test_metrics_log_mirrors_what_it_appends(tmp_path):
  mirror = _Recorder()
  log = metrics.MetricsLog(str(tmp_path), mirror=mirror)
  records = [{'step': 2, 'train_loss': 1.5}, {'step': 2, 'eval_loss': 2.0}]
  for record in records:
    log.append(record)
  log.close()
  assert mirror.records == records == metrics.read_metrics_log(str(tmp_path))
  assert mirror.finished


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
  import wandb  # pylint: disable=g-import-not-at-top,unused-import
  model_dir = tmp_path / 'model'
  result = e2e.run_main(
      e2e.TINY + ['-md', str(model_dir), '--wandb', '--wandb_project', 'tiny',
                  '--wandb_run_name', 'first'], env=_offline_env(tmp_path))
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


def test_help_and_missing_package(tmp_path, monkeypatch):
  result = e2e.spawn_main(['--helpfull'], timeout=120)
  for flag in ('--[no]wandb:', '--wandb_project', '--wandb_run_name'):
    assert flag in result.stdout
  monkeypatch.setitem(sys.modules, 'wandb', None)  # As if not installed.
  result = e2e.run_main(e2e.TINY + ['-md', str(tmp_path / 'm'), '--wandb'])
  e2e.assert_one_line_error(result, '--wandb needs the wandb package',
                            'pip install wandb')
