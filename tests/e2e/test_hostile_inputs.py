"""Every program walked through inputs a careless or hostile user gives:
missing, empty and wrong-kind paths, a FIFO for an image, corrupt records,
bad YAML and config.json values, negative, zero, NaN and huge numbers,
host names that are options, malformed Slurm node lists, ports out of
range. Each ends in exactly one `error:` line naming the input, exit code
2, no traceback, and nothing on disk changed (the tree's hash before and
after, of the trained run and every other place the cases name). All in this process (support/runner.call)."""

import contextlib
import hashlib
import importlib
import json
import os
import shutil

import pytest

from resnet_keras.rundir import ownership
from tests.support import images
from tests.support import records
from tests.support import runner

# What tests/conftest.py's records_run trained with: the trainer's cases
# are reruns of that run, so the run is the one they must leave alone.
RUN_ARGS = [a for a in runner.TINY if not a.startswith(
    ('--use_synthetic_data', '--num_classes', '--num_eval_examples',
     '--batch_size'))] + ['--batch_size=4', '--eval_crop_fraction=0.5',
                          '--global_seed=3']


def tree_hash(root):
  """A digest of every path (empty folders too), and every file's bytes,
  under `root`."""
  digest = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs.sort()
    digest.update(os.path.relpath(folder, root).encode() + b'/\0')
    for name in sorted(files):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode() + b'\0')
      if os.path.isfile(path):
        with open(path, 'rb') as f:
          digest.update(f.read())
  return digest.hexdigest()


@pytest.fixture(scope='module')
def place(records_run, tmp_path_factory):
  """Paths the cases name: the run (a copy of records_run: the programs
  could write into it), its data, and hostile things beside them."""
  data_dir, model_dir = records_run
  root = tmp_path_factory.mktemp('hostile')
  run = root / 'run'
  shutil.copytree(model_dir, run)
  (root / 'a_file').write_text('not a directory\n')
  (root / 'empty').mkdir()
  (root / 'bad.yaml').write_text('batch_size: [1, 2\n')
  corrupt = records.copy_dataset(data_dir, root / 'corrupt')
  for name in os.listdir(os.path.join(corrupt, 'validation')):
    records.truncate(os.path.join(corrupt, 'validation', name))
  images.write_images(root / 'photos')
  os.mkfifo(root / 'fifo.jpg')
  (root / 'fifos').mkdir()
  os.mkfifo(root / 'fifos' / 'a.jpg')
  (root / 'flags.txt').write_text('--no_such_flag=1\n')
  for name, change in (('string_batch', {'batch_size': 'abc'}),
                       ('negative_depth', {'resnet_depth': -3})):
    (root / name).mkdir()
    with open(run / 'config.json') as f:
      record = json.load(f)
    record['config'].update(change)
    with open(root / name / 'config.json', 'w') as f:
      json.dump(record, f)
  # A user's folder with a run's names in it (no run wrote it), another
  # run, and runs whose files reach outside them.
  (root / 'user' / 'saved_model').mkdir(parents=True)
  (root / 'user' / 'config.json').write_text('{"my": "settings"}\n')
  for name in ('other_run', 'linked', 'outside_state', 'hard_linked'):
    shutil.copytree(run, root / name)
  (root / 'linked' / 'plots').mkdir(exist_ok=True)
  (root / 'linked' / 'plots' / 'elsewhere').symlink_to(root / 'empty')
  with open(root / 'outside_state' / 'checkpoint', 'a') as f:
    f.write(f'all_model_checkpoint_paths: "{root}/other_run/ckpt-4"\n')
  os.link(root / 'hard_linked' / 'metrics.jsonl', root / 'metrics_copy')
  return {'root': str(root), 'run': str(run), 'data': data_dir,
          'corrupt': str(corrupt), 'saved_model': str(run / 'saved_model')}


TRAINER = 'resnet_ctl_imagenet_main'
LAUNCHER = 'demo_resnet_keras'
PREPROCESS = 'preprocess_imagenet'
SERVICE = 'resnet_keras.data.service'
NO_ALLOCATION = {'SLURM_JOB_ID': '', 'MULTI_HLS_IPS': ''}

# (program, arguments with {run}, {root}, {data}, ... filled in from
# `place`, environment, what the error line must say).
CASES = [
    # The trainer, rerunning the trained run with one input wrong.
    (TRAINER, ['--data_dir={root}/a_file'], {}, ['--data_dir=', 'is a file']),
    (TRAINER, ['--data_dir={root}/nothing'], {}, ['does not exist']),
    (TRAINER, ['--data_dir={root}/empty'], {}, ['no non-empty train shards']),
    (TRAINER, ['--config={root}/bad.yaml'], {}, ['cannot be read as YAML']),
    (TRAINER, ['--config={root}/nothing.yaml'], {}, ['neither a file nor']),
    (TRAINER, ['--batch_size=-4'], {}, ['--batch_size']),
    (TRAINER, ['--batch_size=0'], {}, ['--batch_size']),
    (TRAINER, ['--base_learning_rate=nan'], {}, ['--base_learning_rate']),
    (TRAINER, ['--train_epochs=99999999999999999999'], {}, ['train_epochs']),
    (TRAINER, ['--image_size=-1'], {}, ['--image_size']),
    (TRAINER, ['--flagfile={root}/flags.txt'], {}, ['no_such_flag']),
    # Run directories: one no run wrote, with or without --clean, and runs
    # whose files point outside them.
    (TRAINER, ['--model_dir={root}/user'], {},
     ['--model_dir={root}/user holds what no run wrote (config.json, '
      'saved_model/)']),
    (TRAINER, ['--model_dir={root}/user', '--clean'], {},
     ['holds what no run wrote']),
    (TRAINER, ['--model_dir={root}/linked'], {},
     ['linked/plots/elsewhere is a symbolic link']),
    (TRAINER, ['--model_dir={root}/linked', '--clean'], {},
     ['linked/plots/elsewhere is a symbolic link']),
    (TRAINER, ['--model_dir={root}/outside_state'], {},
     ['names {root}/other_run/ckpt-4, outside']),
    (TRAINER, ['--model_dir={root}/hard_linked'], {},
     ['metrics.jsonl has 2 names']),
    (TRAINER, ['--model_dir={root}/a_file'], {}, ['a_file']),
    # The launcher (dry runs: nothing would start either way).
    (LAUNCHER, ['--dry_run'], {'TF_BASE_PORT': 'abc'}, ['TF_BASE_PORT=abc']),
    (LAUNCHER, ['--dry_run'], {'TF_BASE_PORT': '99999'},
     ['TF_BASE_PORT=99999', 'from 1 to']),
    (LAUNCHER, ['--dry_run', '--use_horovod', '--num_workers_per_hls=2'],
     {'TF_BASE_PORT': '65535'}, ['TF_BASE_PORT=65535', 'from 1 to 65534']),
    (LAUNCHER, ['--dry_run', '--use_horovod'],
     {'MULTI_HLS_IPS': '-oProxyCommand=touch x,h2'},
     ['MULTI_HLS_IPS', 'not a host name']),
    (LAUNCHER, ['--dry_run', '--use_horovod'], {'MULTI_HLS_IPS': 'h1,h2;id'},
     ['MULTI_HLS_IPS', "'h2;id'"]),
    (LAUNCHER, ['--dry_run', '--data_service_hosts=h1,-p1'], {},
     ['--data_service_hosts', "'-p1'"]),
    (LAUNCHER, ['--dry_run'], {'SLURM_JOB_ID': '5',
                               'SLURM_JOB_NODELIST': 'n[1-'},
     ["Slurm node list 'n[1-'"]),
    (LAUNCHER, ['--dry_run', '--config={root}/bad.yaml'], NO_ALLOCATION,
     ['cannot be read as YAML']),
    (LAUNCHER, ['--dry_run', '--num_workers_per_hls=0'], {},
     ['num_workers_per_hls']),
    (LAUNCHER, ['--dry_run', '--max_restarts=-1'], {}, ['max_restarts']),
    (LAUNCHER, ['--dry_run', '--use_horovod', '--num_workers_per_hls=2',
                '--failure_timeout=0'], {}, ['--failure_timeout=0']),
    (LAUNCHER, ['--dry_run', '--flagfile={root}/nothing'], {}, ['nothing']),
    (LAUNCHER, ['--dry_run', '--batch_size=nan'], {}, ['batch_size']),
    # The converter.
    (PREPROCESS, ['--raw_data_dir={root}/nothing',
                  '--local_scratch_dir={root}/out'], {}, ['raw_data_dir']),
    (PREPROCESS, ['--raw_data_dir={root}/a_file',
                  '--local_scratch_dir={root}/out'], {}, ['raw_data_dir']),
    (PREPROCESS, ['--raw_data_dir={root}/empty',
                  '--local_scratch_dir={root}/out'], {}, ['empty']),
    (PREPROCESS, ['--raw_data_dir={root}/empty', '--local_scratch_dir={run}',
                  '--num_workers=0'], {}, ['num_workers']),
    # The tools.
    ('resnet_keras.validate', ['--model_dir={root}/nothing'], {},
     ['is not a directory']),
    ('resnet_keras.validate', ['--model_dir={root}/a_file'], {},
     ['is not a directory']),
    ('resnet_keras.validate', ['--model_dir={root}/empty'], {},
     ['config.json does not exist']),
    ('resnet_keras.validate', ['--model_dir={root}/string_batch'], {},
     ['config.json', 'batch_size', "'abc'"]),
    ('resnet_keras.validate', ['--model_dir={root}/negative_depth'], {},
     ['config.json', 'resnet_depth']),
    ('resnet_keras.validate', ['--model_dir={run}', '--checkpoint=ckpt-99'],
     {}, ['--checkpoint=ckpt-99']),
    ('resnet_keras.validate', ['--model_dir={run}',
                               '--data_dir={root}/a_file'], {},
     ['--data_dir=', 'is a file']),
    ('resnet_keras.validate', ['--model_dir={run}',
                               '--data_dir={corrupt}'], {}, ['validation']),
    ('resnet_keras.export', ['--model_dir={root}/nothing'], {},
     ['is not a directory']),
    ('resnet_keras.export', ['--model_dir={run}', '--checkpoint=ckpt-99'],
     {}, ['--checkpoint=ckpt-99']),
    ('resnet_keras.export', ['--model_dir={run}', '--format=exe'], {},
     ['--format']),
    ('resnet_keras.export', ['--model_dir={run}', '--quantize=int3'], {},
     ['--quantize']),
    ('resnet_keras.export', ['--model_dir={run}',
                             '--representative_images=-1'], {},
     ['representative_images']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=0'], {},
     ['--last']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=-3'], {},
     ['--last']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=99999999999'], {},
     ['--last']),
    ('resnet_keras.average', ['--model_dir={run}', '--ema=nan'], {},
     ['--ema']),
    ('resnet_keras.average', ['--model_dir={run}', '--ema=2'], {},
     ['--ema']),
    ('resnet_keras.average', ['--model_dir={root}/negative_depth',
                              '--last=2'], {}, ['config.json']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=2',
                              '--output_dir={root}/other_run'], {},
     ['--output_dir={root}/other_run holds what this tool did not write']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=2',
                              '--output_dir={root}/a_file'], {},
     ['--output_dir={root}/a_file is a file']),
    ('resnet_keras.average', ['--model_dir={root}/user', '--last=2'], {},
     ['user/config.json is unreadable']),
    ('resnet_keras.export', ['--model_dir={run}',
                             '--output_dir={root}/other_run'], {},
     ['--output_dir={root}/other_run holds what this tool did not write']),
    ('resnet_keras.export', ['--model_dir={root}/outside_state'], {},
     ['outside']),
    ('resnet_keras.validate', ['--model_dir={root}/linked'], {},
     ['symbolic link']),
    ('resnet_keras.plots', ['{root}/linked'], {}, ['symbolic link']),
    ('resnet_keras.predict', ['--saved_model={root}/nothing',
                              '{root}/fifo.jpg'], {}, ['fifo.jpg']),
    ('resnet_keras.predict', ['--saved_model={saved_model}',
                              '{root}/fifo.jpg'], {},
     ['fifo.jpg', 'is a FIFO']),
    ('resnet_keras.predict', ['--saved_model={saved_model}',
                              '--labels={root}/empty', '{root}/photos'], {},
     ['--labels=', 'is a directory']),
    ('resnet_keras.predict', ['--saved_model={root}/a_file',
                              '{root}/a_file'], {}, ['a_file']),
    ('resnet_keras.predict', ['--saved_model={saved_model}'], {},
     ['image files or folders']),
    ('resnet_keras.plots', ['{root}/nothing'], {}, ['nothing']),
    ('resnet_keras.plots', ['{root}/a_file'], {}, ['a_file']),
    (SERVICE, ['dispatcher', '--port=5050', '--work_dir={root}/a_file'], {},
     ['--work_dir=', 'is a file']),
    (SERVICE, ['dispatcher', '--port=5050', '--work_dir={root}/a_file/sub'],
     {}, ['--work_dir=']),
    (SERVICE, ['dispatcher', '--port=0'], {}, ['port']),
    (SERVICE, ['dispatcher', '--port=70000'], {}, ['port']),
    (SERVICE, ['nobody', '--port=5050'], {}, ['dispatcher or worker']),
]


def _id(case):
  program, args, env, _ = case
  shown = ' '.join(args + [f'{k}={v}' for k, v in env.items() if v])
  return f'{program.split(".")[-1]} {shown}'.replace('{root}/', '')


def run(program, args, env=None):
  return runner.call(importlib.import_module(program), args, env=env)


@pytest.mark.parametrize('program,args,env,fragments', CASES,
                         ids=[_id(c) for c in CASES])
def test_bad_input_is_one_line_and_touches_nothing(place, program, args, env,
                                                   fragments, fresh_tensorflow_state):
  before = tree_hash(place['root'])
  args = [a.format(**place) for a in args]
  if program == TRAINER:
    args = RUN_ARGS + [f'--data_dir={place["data"]}',
                       f'--model_dir={place["run"]}'] + args
  result = run(program, args, env)
  assert result.returncode == 2, result.stdout + result.stderr
  assert 'Traceback' not in result.stdout + result.stderr, result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr
  for fragment in fragments:
    assert fragment.format(**place) in errors[0], errors[0]
  assert tree_hash(place['root']) == before


def test_a_fifo_among_the_images_is_skipped_with_a_line(place, tmp_path):
  """A FIFO named like an image would block predict's read for ever."""
  folder = tmp_path / 'photos'
  images.write_images(folder)
  os.mkfifo(folder / 'b.jpg')
  result = run('resnet_keras.predict', ['--saved_model', place['saved_model'],
                                        str(folder)])
  assert result.returncode == 0, result.stderr
  assert f'skipping {folder}/b.jpg: it is a FIFO (named pipe)' in result.stderr
  assert str(folder / 'b.jpg') not in result.stdout
  assert len(images.parse_predictions(result.stdout)) == len(
      [n for n in os.listdir(folder) if n != 'b.jpg'])


@pytest.mark.parametrize('program,args', [
    (TRAINER, []), (TRAINER, ['--clean']),
    ('resnet_keras.validate', ['--model_dir={run}']),
    ('resnet_keras.export', ['--model_dir={run}']),
    ('resnet_keras.average', ['--model_dir={run}', '--last=2']),
    ('resnet_keras.plots', ['{run}']),
    # A launch, before it contacts a host (these run no sshd).
    (LAUNCHER, ['--use_horovod', '--model_dir={run}'])],
    ids=lambda v: v.split('.')[-1] if isinstance(v, str) else ' '.join(v))
def test_a_second_writer_is_refused_and_the_first_untouched(
    place, program, args, fresh_tensorflow_state):
  """A run directory held (by a trainer still running, say) refuses every
  other writer in one line naming the holder, and changes nothing."""
  with ownership.take(place['run'], 'resnet_ctl_imagenet_main'):
    before = tree_hash(place['root'])
    args = [a.format(**place) for a in args]
    if program == TRAINER:
      args = RUN_ARGS + [f'--data_dir={place["data"]}',
                         f'--model_dir={place["run"]}'] + args
    result = run(program, args, {'MULTI_HLS_IPS': '127.0.0.2,127.0.0.3'}
                 if program == LAUNCHER else None)
    assert tree_hash(place['root']) == before
  runner.assert_one_line_error(
      result, f'is in use by resnet_ctl_imagenet_main (pid {os.getpid()} on',
      'one writer at a time')
  assert result.returncode == 2
