"""Training input from a tf.data service (resnet_keras/data/input_service.py)
read by trainers in processes of their own: the servers as the processes
users start, killed while a trainer reads from them; mirrored replicas
reading one job. (2-process jobs reading one job: the lockstep jobs of
test_multi_worker.py. In this process: unit/ and e2e/.)"""

import os
import signal
import subprocess
import sys
import time

from resnet_keras.data import input_service
from tests.support import runner
from testbed.ports import free_ports


# -- The servers as processes, and faults -------------------------------------


def _server(role, port, log_dir, *args):
  """`python -m resnet_keras.data.service role`, its output in a file (a
  pipe nobody reads would fill and stall it)."""
  log = open(os.path.join(log_dir, f'{role}-{port}.log'), 'a')
  process = subprocess.Popen(
      [sys.executable, '-m', 'resnet_keras.data.service', role,
       '--port', str(port)] + list(args),
      cwd=runner.REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
  process.log_path = log.name
  return process


def _wait_for_line(process, fragment, timeout=120):
  """The first line of `process`'s log containing `fragment` (waits)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(process.log_path) as f:
      for line in f:
        if fragment in line:
          return line
    assert process.poll() is None, open(process.log_path).read()[-3000:]
    time.sleep(0.2)
  raise AssertionError(f'no "{fragment}" in:\n' +
                       open(process.log_path).read()[-3000:])


class _Log:
  """A process's output lines, read as they come (a thread per process)."""

  def __init__(self, process):
    import threading  # pylint: disable=g-import-not-at-top
    self.lines = []
    self._thread = threading.Thread(
        target=lambda: [self.lines.append(l) for l in process.stdout],
        daemon=True)
    self._thread.start()

  def last_step(self):
    steps = [int(l.split('step ')[1].split('/')[0]) for l in self.lines
             if ' I step ' in l]
    return steps[-1] if steps else 0

  def wait_for_step(self, step, timeout=120):
    deadline = time.monotonic() + timeout
    while self.last_step() < step:
      assert time.monotonic() < deadline, ''.join(self.lines[-20:])
      time.sleep(0.2)
    return self.last_step()


def test_faults_a_lost_worker_a_restarted_dispatcher_the_last_worker(
    service_records, tmp_path):
  """One trainer through three faults: a data worker killed while another
  serves (training goes on), the dispatcher killed and restarted from its
  work_dir (goes on), the last data worker killed (the run ends with one
  line within --tf_data_service_timeout and a poll)."""
  dispatcher_port, *worker_ports = free_ports(3)
  work_dir = str(tmp_path / 'dispatcher')
  logs = str(tmp_path)
  servers = [_server('dispatcher', dispatcher_port, logs, '--work_dir',
                     work_dir)]
  trainer = None
  try:
    assert 'fault tolerant' in _wait_for_line(servers[0], 'ready at')
    for port in worker_ports:
      servers.append(_server('worker', port, logs, '--dispatcher',
                             f'127.0.0.1:{dispatcher_port}'))
      _wait_for_line(servers[-1], 'ready at 127.0.0.1:')
    timeout = 15
    trainer = subprocess.Popen(
        [sys.executable, runner.MAIN] + [
            a for a in runner.TINY if not a.startswith(
                ('--use_synthetic_data', '--num_classes', '--train_steps'))] +
        [f'--data_dir={service_records}', '--train_steps=1000000',
         '--train_epochs=100000', '--epochs_between_evals=100000',
         f'--model_dir={tmp_path / "model"}', '--log_steps=2',
         '--tf_data_service', f'grpc://127.0.0.1:{dispatcher_port}',
         f'--tf_data_service_timeout={timeout}'],
        cwd=runner.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    log = _Log(trainer)
    step = log.wait_for_step(10)
    assert all('| input wait ' in l for l in log.lines if ' I step ' in l)

    servers[1].kill()  # A data worker; the other serves.
    step = log.wait_for_step(step + 40)

    servers[0].kill()  # The dispatcher, restarted from its journal.
    servers[0].wait()
    servers[0] = _server('dispatcher', dispatcher_port, logs, '--work_dir',
                         work_dir)
    _wait_for_line(servers[0], 'ready at')
    step = log.wait_for_step(step + 40)

    servers[2].kill()  # The last data worker.
    killed = time.monotonic()
    assert trainer.wait(timeout=timeout + 60) == input_service.STALLED_EXIT_CODE
    assert time.monotonic() - killed < timeout + 30
    last = log.lines[-1].strip()
    assert last.startswith('error: no batch from the tf.data service at '
                           f'grpc://127.0.0.1:{dispatcher_port} for ')
    assert 'Traceback' not in ''.join(log.lines)
  finally:
    for process in servers + [trainer]:
      if process and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
          process.wait(timeout=10)
        except subprocess.TimeoutExpired:
          process.kill()


def test_mirrored_replicas_read_the_service(service_records, tmp_path,
                                            in_process_service):
  """Two replicas of one process (-ds mirrored over logical CPUs) each
  read their batches from the job."""
  dispatcher, workers = in_process_service
  model_dir = str(tmp_path / 'model')
  args = [a for a in runner.TINY if not a.startswith(
      ('--use_synthetic_data', '--num_classes', '--batch_size'))]
  result = runner.spawn_main(
      args + ['-ds', 'mirrored', '--num_cpu_replicas=2', '--batch_size=8',
              f'--data_dir={service_records}', f'--model_dir={model_dir}',
              f'--tf_data_service={dispatcher.target}'], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = runner.read_summary(model_dir)
  assert summary['num_replicas'] == 2 and summary['train_steps'] == 4
  assert summary['tf_data_service']['address'] == dispatcher.target
  assert sum(w._num_tasks() for w in workers) >= 1  # pylint: disable=protected-access
