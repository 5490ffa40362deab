"""What a run's own history makes hostile, beside test_hostile_inputs.py
(whose `place`, RUN_ARGS and tree_hash these reuse): a resume with another
optimizer or fewer steps, damaged run files, a model_dir too long to write
in, predict on a feature vector, class folders labels.txt cannot hold, a
link that loops; each one `error:` line, exit 2, the run directory as it
was (or, for a file that is only a record, one warning and the run goes
on). And stop signals at every phase of a training process of its own
(closed terminal, Ctrl-C, SIGTERM; the only tests here that start one):
one line each, and the rerun of the same command finishes the run."""

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time

import pytest

from resnet_keras.rundir import checkpoints
# `place` is a fixture: imported, it is this module's too.
from tests.e2e.test_hostile_inputs import (  # pylint: disable=unused-import
    RUN_ARGS, TRAINER, place, run, tree_hash)
from tests.support import converter
from tests.support import runner


def _copy(place, tmp_path):
  """A copy of the trained run, for a case to change."""
  model_dir = str(tmp_path / 'run')
  shutil.copytree(place['run'], model_dir)
  return model_dir


def _rerun(place, model_dir, *args):
  return run(TRAINER, RUN_ARGS + [f'--data_dir={place["data"]}',
                                  f'--model_dir={model_dir}'] + list(args))


def _assert_one_line(result, *fragments):
  assert result.returncode == 2, result.stdout + result.stderr
  assert 'Traceback' not in result.stdout + result.stderr, result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr
  for fragment in fragments:
    assert fragment in errors[0], errors[0]


# (the rerun's flags, what to write into the run's files (None: delete it;
# NAME/: a folder there), what the error line says); records_run trained 2
# epochs of 4 steps with SGD.
RESUMES = [
    ('another optimizer', ['-te', '2', '--optimizer=LAMB'], {},
     ['--optimizer=SGD', '--optimizer=LAMB', '--restore_from=']),
    ('fewer steps', ['-te', '1'], {}, ['trained to step 8', '4 steps']),
    ('world_sizes.json cut short', ['-te', '3'],
     {'world_sizes.json': '[{"step": 0, "glo'}, ['world_sizes.json']),
    ('world_sizes.json not JSON', ['-te', '3'],
     {'world_sizes.json': 'workers: 1\n'}, ['world_sizes.json']),
    ('world_sizes.json of wrong types', ['-te', '3'],
     {'world_sizes.json': '[{"step": "0", "global_batch_size": 4}]'},
     ['world_sizes.json', 'integer "step"']),
    ('world_sizes.json an object', ['-te', '3'],
     {'world_sizes.json': '{"step": 0}'}, ['world_sizes.json']),
    ('metrics.jsonl of wrong types', ['-te', '3'],
     {'metrics.jsonl': '{"step": 4, "train_loss": 2.0}\n[4]\n'},
     ['metrics.jsonl line 2']),
    ('run_summary.json a folder', ['-te', '3'],
     {'run_summary.json/': ''}, ['run_summary.json']),
    ('goodput.json a folder', ['-te', '3'],
     {'goodput.json/': ''}, ['goodput.json']),
    # Read where a run from before world_sizes.json was warm-started.
    ('warm_start.json of wrong types', ['-te', '3'],
     {'world_sizes.json': None, 'warm_start.json': '{"step": "4"}'},
     ['warm_start.json']),
]


@pytest.mark.parametrize('args,files,fragments',
                         [c[1:] for c in RESUMES], ids=[c[0] for c in RESUMES])
def test_a_resume_it_cannot_be_is_one_line_and_touches_nothing(
    place, tmp_path, args, files, fragments, fresh_tensorflow_state):
  model_dir = _copy(place, tmp_path)
  for name, text in files.items():
    path = os.path.join(model_dir, name)
    if text is None or name.endswith('/'):
      os.remove(path.rstrip('/'))
    if text is None:
      continue
    if name.endswith('/'):
      os.makedirs(path)
      continue
    with open(path, 'w') as f:
      f.write(text)
  before = tree_hash(model_dir)
  _assert_one_line(_rerun(place, model_dir, *args), *fragments)
  assert tree_hash(model_dir) == before


def test_damaged_records_are_one_warning_and_the_rerun_finishes(
    place, tmp_path, fresh_tensorflow_state):
  """goodput.json and run_summary.json are accounts no step depends on: a
  rerun of the finished run (nothing to train) keeps what reads, rewrites
  them, and reports its run's figures, not NaN."""
  model_dir = _copy(place, tmp_path)
  with open(os.path.join(model_dir, 'goodput.json')) as f:
    attempts = json.load(f)
  with open(os.path.join(model_dir, 'goodput.json'), 'w') as f:
    json.dump(attempts + [{'process_start': 'yesterday'}, 7], f)
  with open(os.path.join(model_dir, 'run_summary.json'), 'w') as f:
    f.write('{"train_steps": 8, "train_lo')
  checkpoints = {n: _digest(model_dir, n)
                 for n in os.listdir(model_dir) if n.startswith('ckpt-')}

  result = _rerun(place, model_dir, '-te', '2')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  warnings = [l for l in result.stderr.splitlines() if ' W ' in l]
  assert len(warnings) == 1 and 'goodput.json is damaged' in warnings[0], (
      result.stderr)
  assert 'trained to step 8, the end of this run: nothing to train' in (
      result.stderr)
  summary = runner.read_summary(model_dir)
  last_logged = [r for r in _metrics(model_dir) if 'train_loss' in r][-1]
  assert summary['train_steps'] == last_logged['step'] == 8
  assert summary['train_loss'] == last_logged['train_loss']
  assert summary['goodput']['attempts'] == len(attempts) + 1
  assert checkpoints == {n: _digest(model_dir, n) for n in
                         checkpoints}


def _digest(folder, name):
  with open(os.path.join(folder, name), 'rb') as f:
    return hash(f.read())


def _metrics(model_dir):
  with open(os.path.join(model_dir, 'metrics.jsonl')) as f:
    return [json.loads(l) for l in f if l.strip()]


def test_a_model_dir_too_long_to_write_in_is_refused_before_any_work(
    place, tmp_path):
  for model_dir, fragment in [
      (tmp_path / ('d' * 300) / 'run', 'NAME_MAX'),
      (tmp_path.joinpath(*['d' * 200] * 20), 'PATH_MAX')]:
    result = _rerun(place, str(model_dir), '-te', '2')
    _assert_one_line(result, '--model_dir=', fragment)
    assert os.listdir(tmp_path) == []


def test_predict_on_a_feature_vector_is_one_line(place, tmp_path,
                                                 fresh_tensorflow_state):
  exported = run('resnet_keras.export', [
      f'--model_dir={place["run"]}', '--checkpoint=ckpt-8',
      f'--output_dir={tmp_path}'])
  assert exported.returncode == 0, exported.stderr[-3000:]
  features = tmp_path / 'ckpt-8' / 'feature_vector'
  before = tree_hash(str(tmp_path))
  result = run('resnet_keras.predict', [f'--saved_model={features}',
                                        f'{place["root"]}/photos'])
  _assert_one_line(result, 'feature vector', str(tmp_path / 'ckpt-8' /
                                                 'saved_model'))
  assert tree_hash(str(tmp_path)) == before


@pytest.mark.parametrize('hostile,fragment', [
    ('newline', 'control character'), ('tab', 'control character'),
    ('blank', 'blank'), ('link loop', 'Too many levels of symbolic links')])
def test_preprocess_refuses_what_labels_txt_or_a_walk_cannot_hold(
    tmp_path, hostile, fragment):
  raw = converter.make_raw(str(tmp_path))
  train = os.path.join(raw, 'train')
  if hostile == 'link loop':
    os.symlink('loop', os.path.join(train, 'loop'))
  else:
    name = {'newline': 'n014\nbad', 'tab': 'n014\tbad', 'blank': 'n014 '}[
        hostile]
    shutil.copytree(os.path.join(train, converter.SYNSETS[0]),
                    os.path.join(train, name))
  before = tree_hash(raw)
  out = tmp_path / 'out'
  result = run('preprocess_imagenet', [f'--raw_data_dir={raw}',
                                       f'--local_scratch_dir={out}'])
  _assert_one_line(result, fragment)
  assert tree_hash(raw) == before and not out.exists()


# -- Stop signals, to a trainer process of its own ---------------------------

# Until a signal: many more steps than reach it.
_LONG = [a for a in runner.TINY if not a.startswith('--train_steps')] + [
    '--train_steps=100000']


class _Trainer:
  """resnet_ctl_imagenet_main.py `args` in a process of its own, its
  stderr read line by line. With `terminal`, its stdout is a terminal it
  controls, as in a terminal window (a progress bar draws there): closing
  that terminal sends SIGHUP."""

  def __init__(self, args, terminal=False):
    self.seen = []
    self._terminal = None
    stdout = subprocess.DEVNULL
    if terminal:
      self._terminal, stdout = pty.openpty()
    self.process = subprocess.Popen(
        [sys.executable, runner.MAIN] + args, cwd=runner.REPO_ROOT,
        stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
        text=True, start_new_session=terminal,
        preexec_fn=_take_terminal if terminal else None)
    if terminal:
      os.close(stdout)
      self._drained = threading.Event()
      threading.Thread(target=self._drain, daemon=True).start()

  def _drain(self):
    # What the progress bar draws, read so that it never waits on a full
    # terminal.
    while not self._drained.is_set():
      if select.select([self._terminal], [], [], 0.1)[0]:
        try:
          os.read(self._terminal, 65536)
        except OSError:
          return

  def wait_for(self, text, timeout=240):
    deadline = time.time() + timeout
    for line in self.process.stderr:
      self.seen.append(line)
      if text in line:
        return line
      assert time.time() < deadline, ''.join(self.seen)
    raise AssertionError(f'ended before "{text}": ' + ''.join(self.seen))

  def close_terminal(self):
    self._drained.set()
    time.sleep(0.2)
    os.close(self._terminal)

  def ended(self, timeout=120):
    """(exit code, its stderr after what wait_for read)."""
    try:
      code = self.process.wait(timeout=timeout)
    finally:
      self.process.kill()
    rest = self.process.stderr.read()
    self.seen.append(rest)
    return code, rest


def _take_terminal():
  signal.signal(signal.SIGHUP, signal.SIG_DFL)  # Under nohup, too.
  fcntl.ioctl(1, termios.TIOCSCTTY, 0)


def _assert_stopped(code, rest, exit_code, *fragments):
  assert code == exit_code, rest
  assert 'Traceback' not in rest, rest
  errors = [l for l in rest.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and rest.strip().splitlines()[-1] == errors[0], rest
  for fragment in fragments:
    assert fragment in errors[0], errors[0]


def _checkpoints(model_dir):
  return {n: _digest(model_dir, n) for n in os.listdir(model_dir)
          if n.startswith('ckpt-')}


@pytest.mark.slow
def test_stops_at_every_phase_are_one_line_and_the_rerun_finishes(tmp_path):
  """A closed terminal in training saves and stops (as SIGTERM); Ctrl-C and
  SIGTERM in the export stop it at once, the checkpoint kept; the rerun
  of the same command then trains nothing and writes the export and
  run_summary.json with the run's figures."""
  model_dir = str(tmp_path / 'model')
  trainer = _Trainer([f'--model_dir={model_dir}'] + _LONG, terminal=True)
  trainer.wait_for('step 4/')
  trainer.close_terminal()
  code, rest = trainer.ended()
  _assert_stopped(code, rest, 129, 'stopped by SIGHUP at step', 'nohup')
  step = int(rest.split('stopped by SIGHUP at step ')[1].split(';')[0])
  assert step >= 4 and runner.checkpoint_steps(model_dir) == [step]

  # The same command from here on: it ends 2 steps on, with the export.
  args = [f'--model_dir={model_dir}', '--enable_checkpoint_and_export'] + (
      runner.TINY[:-4] + [f'--train_steps={step + 2}', '--steps_per_loop=2',
                          '--log_steps=2', '--skip_eval'])
  for signum, exit_code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
    trainer = _Trainer(args)
    if signum == signal.SIGTERM:
      trainer.wait_for('nothing to train')
    trainer.wait_for('exporting the model of step')
    saved = _checkpoints(model_dir)
    trainer.process.send_signal(signum)
    code, rest = trainer.ended()
    _assert_stopped(code, rest, exit_code,
                    f'stopped by {signum.name} during the export of step '
                    f'{step + 2}', 'rerun the same command')
    # The last checkpoint's write may still run beside the export: the
    # stop waits for it to end (checkpoints.Saver.waited_at_end), and
    # changes nothing written before.
    final = f'ckpt-{step + 2}.'
    assert {n: d for n, d in _checkpoints(model_dir).items()
            if not n.startswith(final)} == {
                n: d for n, d in saved.items() if not n.startswith(final)}
    assert runner.checkpoint_steps(model_dir) == [step, step + 2]
    checkpoints.check_readable(os.path.join(model_dir, f'ckpt-{step + 2}'))
    assert not os.path.exists(os.path.join(model_dir, 'saved_model'))
    assert not os.path.exists(os.path.join(model_dir, 'run_summary.json'))

  finished = runner.run_main(args)
  assert finished.returncode == 0, finished.stderr[-3000:]
  summary = runner.read_summary(model_dir)
  last_logged = [r for r in _metrics(model_dir) if 'train_loss' in r][-1]
  assert summary['train_steps'] == last_logged['step'] == step + 2
  assert summary['train_loss'] == last_logged['train_loss']
  assert sorted(os.listdir(os.path.join(model_dir, 'saved_model'))) == [
      'assets', 'fingerprint.pb', 'saved_model.pb', 'variables']
  assert not os.path.exists(os.path.join(model_dir, 'saved_model.partial'))


@pytest.mark.slow
@pytest.mark.parametrize('delay', [0.3, 3])
def test_ctrl_c_while_the_trainer_starts_is_one_line(tmp_path, delay):
  """In its imports (TensorFlow's take seconds) or its set-up: nothing to
  save yet, and nothing written is lost."""
  job = subprocess.Popen(
      [sys.executable, runner.MAIN, f'--model_dir={tmp_path}/model'] + _LONG,
      cwd=runner.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True)
  time.sleep(delay)
  job.send_signal(signal.SIGINT)
  try:
    code = job.wait(timeout=120)
  finally:
    job.kill()
  _assert_stopped(code, job.stderr.read(), 130, "SIGINT")
