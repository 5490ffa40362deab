"""resnet_keras/engine/distribution.py: device choice and input options, on fake
devices."""

import pytest

from resnet_keras.engine import distribution
from common.errors import UsageError

GPUS = ['/physical_device:GPU:0', '/physical_device:GPU:1',
        '/physical_device:GPU:2', '/physical_device:GPU:3']


@pytest.mark.parametrize('local_rank', [0, 1, 2, 3])
def test_each_horovod_process_takes_its_local_ranks_gpu(local_rank):
  assert distribution.gpu_for_local_rank(GPUS, local_rank, 4) == (
      GPUS[local_rank])


def test_fewer_processes_than_gpus_leave_the_rest_idle():
  assert distribution.gpu_for_local_rank(GPUS, 1, 2) == GPUS[1]


def test_a_cpu_host_pins_nothing():
  assert distribution.gpu_for_local_rank([], 3, 8) is None


def test_more_processes_than_gpus_is_an_error_not_sharing():
  with pytest.raises(UsageError) as error:
    distribution.gpu_for_local_rank(GPUS[:2], 2, 3)
  message = str(error.value)
  assert '3 Horovod processes' in message and '2 GPU(s)' in message
  assert 'at most 2 workers per host' in message and '\n' not in message


@pytest.mark.parametrize('preloading,has_gpu,fetch', [
    (True, True, True), (True, False, False), (False, True, False),
    (False, False, False)])
def test_preloading_fetches_to_the_device_only_on_accelerators(
    preloading, has_gpu, fetch):
  options = distribution.input_options(preloading, has_gpu)
  assert options.experimental_fetch_to_device is fetch
  assert options.experimental_per_replica_buffer_size == 2


def test_horovod_on_a_cpu_host_negotiates_every_10_ms_unless_told():
  # At Horovod's 1 ms a waiting rank busy-polls a core away from training.
  assert distribution.horovod_defaults(has_gpu=False) == {
      'HOROVOD_CYCLE_TIME': '10'}
  assert distribution.horovod_defaults(has_gpu=True) == {}


def test_the_backend_waits_on_the_progress_while_the_workers_join(
    monkeypatch):
  """hvd.init() waits for every rank: a rank frozen before it got there
  held the others for good until the progress (the stuck-worker
  watchdog's) was armed around it."""
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  progress = distribution.Progress()
  seen = []
  fake = types.SimpleNamespace(
      init=lambda: seen.append(progress.waiting_since()), rank=lambda: 1,
      size=lambda: 2, local_rank=lambda: 0, local_size=lambda: 1)
  monkeypatch.setitem(sys.modules, 'horovod.tensorflow', fake)
  monkeypatch.setattr(distribution, 'horovod_defaults', lambda gpu: {})
  backend = distribution.build_backend('off', use_horovod=True,
                                       progress=progress)
  assert seen and seen[0] > 0  # Waiting while init ran...
  assert progress.waiting_since() == 0  # ...and no longer.
  assert backend.progress is progress
  assert (backend.worker_index, backend.num_workers) == (1, 2)
