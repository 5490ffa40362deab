"""--wandb (resnet_keras/training/tracking.py): when it goes offline, a missing
package, the metrics log mirrored as it is appended. (A run logged to W&B,
offline: e2e/.)"""

import sys

import pytest

from resnet_keras.engine import metrics
from resnet_keras.training import tracking
from common.errors import UsageError


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
