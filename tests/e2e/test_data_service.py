"""A run (run.run in this process) training from a tf.data service of
in-process servers, resuming through it and without it."""

import dataclasses
import os

import pytest

from common.errors import UsageError
from resnet_keras.training import run as run_lib
from testbed.ports import free_ports
from tests.support.data_service import service_config


@pytest.mark.slow
def test_a_run_trains_from_the_service_and_resumes_without_it(
    service_records, tmp_path, in_process_service):
  dispatcher, workers = in_process_service
  cfg = service_config(tmp_path, service_records, dispatcher.target,
                       train_steps=2, enable_checkpoint_and_export=True)
  summary = run_lib.run(cfg)
  assert summary['train_steps'] == 2
  assert summary['tf_data_service'] == {
      'address': dispatcher.target, 'sharding': 'off', 'data_workers': None}
  # Its batches came from the service's workers.
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access
  # Resumed from its checkpoint through the service (a new job), then
  # without it.
  resumed = run_lib.run(dataclasses.replace(cfg, train_steps=4))
  assert resumed['resumed_from_step'] == 2 and resumed['train_steps'] == 4
  local = run_lib.run(dataclasses.replace(cfg, train_steps=6,
                                          tf_data_service=''))
  assert local['resumed_from_step'] == 4 and local['train_steps'] == 6
  assert local['tf_data_service'] is None
  # A dispatcher that is not there: one line before anything trains.
  with pytest.raises(UsageError, match='no tf.data service dispatcher'):
    run_lib.run(dataclasses.replace(
        cfg, train_steps=8,
        tf_data_service=f'grpc://127.0.0.1:{free_ports(1)[0]}'))
  assert not os.path.exists(os.path.join(str(tmp_path), 'ckpt-8.index'))
