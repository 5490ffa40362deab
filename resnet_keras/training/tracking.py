"""--wandb: a run's metrics.jsonl records and config, mirrored to W&B.

wandb is optional: it is imported only when --wandb asks for it, and its
absence is one line saying how to install it. Every record metrics.MetricsLog
appends (log lines and evaluations, keyed by `step`) is logged as is, and the
effective config and training plan are the W&B run's config. The W&B run id
is kept in model_dir/wandb/, so a resumed training run continues its W&B run.

W&B runs offline (files under model_dir/wandb/, uploaded later with
`wandb sync`) when the user has not logged in or its server is unreachable;
WANDB_MODE, when set, decides instead.
"""

import dataclasses
import netrc
import os
import socket
import urllib.parse
from typing import Callable, Dict, Mapping, Optional

from absl import logging

from resnet_keras.rundir import run_directory
from resnet_keras.config import RunConfig
from resnet_keras.config.plan import TrainingPlan
from common.errors import UsageError

DEFAULT_BASE_URL = 'https://api.wandb.ai'


def import_wandb():
  try:
    import wandb  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError('--wandb needs the wandb package: pip install wandb') \
        from None
  return wandb


def server_host(environ: Mapping[str, str]) -> str:
  return urllib.parse.urlparse(
      environ.get('WANDB_BASE_URL', DEFAULT_BASE_URL)).hostname


def has_api_key(environ: Mapping[str, str], host: str) -> bool:
  """Whether `wandb login` (a netrc entry) or WANDB_API_KEY gives a key."""
  if environ.get('WANDB_API_KEY'):
    return True
  try:
    return netrc.netrc(environ.get('NETRC')).authenticators(host) is not None
  except (OSError, netrc.NetrcParseError):
    return False


def is_reachable(host: str, timeout: float = 3.0) -> bool:
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
  except OSError:
    return False
  return True


def offline_reason(environ: Mapping[str, str],
                   reachable: Callable[[str], bool] = is_reachable
                   ) -> Optional[str]:
  """Why W&B must run offline; None: online, or WANDB_MODE decides."""
  if environ.get('WANDB_MODE'):
    return None
  host = server_host(environ)
  if not has_api_key(environ, host):
    return 'not logged in (wandb login, or WANDB_API_KEY)'
  if not reachable(host):
    return f'{host} is not reachable'
  return None


class WandbMirror:
  """metrics.Mirror that logs each record to a W&B run."""

  def __init__(self, run):
    self._run = run
    # Records carry their own step; charting against it (rather than W&B's
    # call counter) keeps a resumed run's re-logged steps in place.
    run.define_metric('step')
    run.define_metric('*', step_metric='step')

  def log(self, record: Dict) -> None:
    self._run.log(record)

  def finish(self) -> None:
    self._run.finish()


def _run_id(wandb, wandb_dir: str) -> str:
  """model_dir's W&B run id: read, or made and kept for later resumes."""
  path = os.path.join(wandb_dir, run_directory.WANDB_RUN_ID_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return f.read().strip()
  run_id = wandb.util.generate_id()
  with open(path, 'w') as f:
    f.write(run_id)
  return run_id


def start_wandb(cfg: RunConfig, plan: TrainingPlan) -> WandbMirror:
  """A W&B run for `cfg` (the effective config) in cfg.model_dir/wandb."""
  wandb = import_wandb()
  reason = offline_reason(os.environ)
  offline = bool(reason) or os.environ.get('WANDB_MODE') == 'offline'
  wandb_dir = os.path.join(cfg.model_dir, run_directory.WANDB_DIR)
  os.makedirs(wandb_dir, exist_ok=True)
  run = wandb.init(
      project=cfg.wandb_project, name=cfg.wandb_run_name,
      id=_run_id(wandb, wandb_dir), dir=cfg.model_dir,
      # W&B ignores (and warns about) resuming an offline run.
      resume=None if offline else 'allow',
      mode='offline' if reason else None,
      config={**dataclasses.asdict(cfg),
              'training_plan': dataclasses.asdict(plan)},
      # The terminal stays ours: no wrapped stdout/stderr, no banner.
      settings=wandb.Settings(console='off', silent=True))
  if reason:
    logging.info('--wandb: offline, %s; upload later with: wandb sync %s',
                 reason, run.dir.rsplit(os.sep, 1)[0])
  else:
    logging.info('--wandb: logging to %s', run.url or run.dir)
  return WandbMirror(run)
