"""The scripts in benchmarks/ start as benchmarks/README.md runs them: `python
-m benchmarks.NAME` from the repository's root, which is what broke when they
still imported each other as top-level modules. The cheap ones also run, on
inputs of seconds, and print their figures; the rest (minutes of training,
the namespace cluster, mpirun, PyTorch) are started for their --help only.
The starts and the runs share one fresh interpreter, each script run as
`python -m` runs it, not yet imported."""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.support import records
from tests.support import runner

# Every script, so that a new one is covered without being listed here.
SCRIPTS = sorted(
    os.path.basename(path)[:-len('.py')] for path in glob.glob(
        os.path.join(runner.REPO_ROOT, 'benchmarks', '*.py')))

# Each script's --help, then the tiny runs (below) this session selected, in
# one interpreter (TensorFlow's import, 4-5 s of CPU, paid once, not per
# script), each run as `python -m` runs it, its output captured apart. One
# JSON line per script run: its exit code, or the last line of what it
# raised, and what it printed on stdout and stderr. A script another one
# imported, or one run before, is run afresh, as `python -m` finds it: not
# yet imported.
_DRIVER = r'''
import contextlib, io, json, runpy, sys, traceback
for kind, name, args in json.loads(sys.argv[1]):
  sys.argv = [f'benchmarks/{name}.py'] + args
  sys.modules.pop(f'benchmarks.{name}', None)
  out, err, code, error = io.StringIO(), io.StringIO(), 0, None
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      runpy.run_module(f'benchmarks.{name}', run_name='__main__',
                       alter_sys=True)
  except SystemExit as e:
    if isinstance(e.code, str):  # sys.exit(message): Python prints it.
      err.write(e.code + '\n')
    code = e.code if isinstance(e.code, int) else int(e.code is not None)
  except Exception as e:
    code, error = 1, traceback.format_exception_only(e)[-1].strip()
  print('script-result', json.dumps({
      'kind': kind, 'name': name, 'code': code, 'error': error,
      'stdout': out.getvalue(), 'stderr': err.getvalue()}), flush=True)
'''


def _selected(request, test):
  """The items of the test function `test` this session runs."""
  return [item for item in request.session.items
          if getattr(item, 'originalname', None) == test]


@pytest.fixture(scope='module')
def scripts(request, tmp_path_factory):
  """(kind, name) -> a script's result (_DRIVER's): ('help', name) for
  each script's --help, ('run', name) for each run of
  test_tiny_run_prints_its_figures and of input_pipeline this session
  runs."""
  runs = sorted({item.callspec.params['name'] for item in _selected(
      request, 'test_tiny_run_prints_its_figures')})
  plan = [('help', name, ['--help']) for name in SCRIPTS] + [
      ('run', name, _TINY_RUNS[name][0]) for name in runs]
  if _selected(request, 'test_input_pipeline_on_records_of_its_own'):
    data_dir = str(tmp_path_factory.mktemp('input_pipeline'))
    # Fewer records than its 10 warm-up calls (it divided by zero there).
    records.write_dataset(data_dir, train_per_shard=(3, 2))
    plan.append(('run', 'input_pipeline', [
        f'--data_dir={data_dir}', '--batch_size=2', '--batches=2',
        '--repeats=1']))
  result = subprocess.run([sys.executable, '-c', _DRIVER, json.dumps(plan)],
                          cwd=runner.REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  found = [json.loads(line.split(' ', 1)[1])
           for line in result.stdout.splitlines()
           if line.startswith('script-result ')]
  assert [(r['kind'], r['name']) for r in found] == [
      (kind, name) for kind, name, _ in plan], result.stderr[-3000:]
  return {(r['kind'], r['name']): r for r in found}


# The scripts' runs share one interpreter (`scripts`): in one worker.
@pytest.mark.xdist_group('benchmark_scripts')
@pytest.mark.parametrize('name', SCRIPTS)
def test_help_starts_from_the_repository_root(scripts, name):
  result = scripts['help', name]
  assert result['error'] is None, result['error']
  output = result['stdout'] + result['stderr']
  if 'Try --helpfull' in output:
    # absl's --help prints the flags and exits 1 unless the script turns
    # that into 0 (common/cli.py).
    assert result['code'] in (0, 1), result
  else:
    assert result['code'] == 0, result
    assert f'usage: {name}.py' in output, output


def _figures(pattern, output):
  """The numbers `pattern`'s groups capture in `output` (a line of it)."""
  match = re.search(pattern, output, re.MULTILINE)
  assert match, f'no {pattern!r} in:\n{output[-3000:]}'
  return [float(group) for group in match.groups()]


def _run(name, args):
  """`python -m benchmarks.NAME args`, as the README runs it; its stdout."""
  result = runner.spawn_tool(f'benchmarks.{name}', args, timeout=300)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  return result.stdout


# The trainer's smallest model, where a script passes flags through to it.
_TINY_MODEL = ('--resnet_depth=10 --width_multiplier=0.25 --image_size=32 '
               '--num_classes=10')

# name -> (arguments of a run of seconds, the lines it prints its figures on;
# every figure must be positive).
_TINY_RUNS = {
    'hardware': (
        ['--matmul_size=256', '--bandwidth_elements=65536'],
        [r'^matmul peak, 256\^3: fp32 ([\d.]+) GFLOP/s, bf16 ([\d.]+) GFLOP/s$',
         r'^memory bandwidth, fp32 adds on 0\.25 MiB tensors: add ([\d.]+) '
         r'GB/s, in-place add ([\d.]+) GB/s$']),
    'roofline': (
        ['--no_measure', '--batch=1', '--dtype=fp32', '--matmul_size=256',
         '--bandwidth_elements=65536'],
        [r'^matmul peak fp32 ([\d.]+) GFLOP/s',
         r'^ResNet-50, batch 1, fp32: ([\d.]+) GFLOP and ([\d.]+) MB per',
         r'^serial ceiling +([\d.]+) img/s',
         r'^overlapped ceiling +([\d.]+) img/s']),
    'memory': (
        ['--steps=6', '--log_steps=2', '--batch=2', '--image_size=32',
         '--resnet_depth=10', '--dtype=fp32'],
        [r'^ +6 +(\d+)$', r'^peak sampled RSS: (\d+) MiB$']),
    'levers': (
        ['--levers=steps_per_loop', '--batch=2', '--dtype=fp32',
         '--repeats=1', '--loops=2', '--steps_per_loop=1',
         f'--model_flags={_TINY_MODEL}'],
        [r'^steps_per_loop +1 step/loop +([\d.]+) default +([\d.]+) +'
         r'([\d.]+)$']),
    'launcher_scale': (
        ['--hosts=3', '--placements=slurm', '--backends=horovod',
         '--delay=0'],
        [r'^\| slurm \| horovod \| 3 \| ([\d.]+) \| ([\d.]+) \| '
         r'([\d.]+) \| (\d+) \| \d+ \| (\d+) \| 0 \| [\d,]+ \| '
         r'([\d.]+) \|$']),
    'recompute': (
        ['--resnet_depth=10', '--image_size=32', '--batch=2', '--warmup=1',
         '--steps=1'],
        [r'^ +off +([\d.]+) +(\d+) +(\d+) ',
         r'^ +on +([\d.]+) +(\d+) +(\d+) ']),
}


# The runs of 8 s or more on 2 cores (pytest.ini's slow): each starts a
# training process or two of its own.
_SLOW_RUNS = ('levers', 'memory', 'recompute')


@pytest.mark.xdist_group('benchmark_scripts')
@pytest.mark.parametrize('name', [
    pytest.param(name, marks=[pytest.mark.slow] if name in _SLOW_RUNS else [])
    for name in sorted(_TINY_RUNS)])
def test_tiny_run_prints_its_figures(scripts, name):
  _, patterns = _TINY_RUNS[name]
  output = _stdout(scripts['run', name])
  assert output.startswith(('machine: ', 'CPU: ')), output
  for pattern in patterns:
    assert all(figure > 0 for figure in _figures(pattern, output)), pattern


def _stdout(result):
  """A run's output, once it ended with 0 and raised nothing."""
  assert result['error'] is None and result['code'] == 0, (
      result['error'], result['stdout'][-2000:] + result['stderr'][-3000:])
  return result['stdout']


@pytest.mark.xdist_group('benchmark_scripts')
def test_input_pipeline_on_records_of_its_own(scripts):
  """On records of its own (`scripts` writes them)."""
  output = _stdout(scripts['run', 'input_pipeline'])
  for side in ('ours', 'model_garden', 'ours_seeded', 'ours_private_threads',
               'ours_uint8'):
    assert _figures(rf'^{side} +([\d.]+) images/sec', output)[0] > 0
  assert all(ms > 0 for ms in _figures(
      r'^per image, one thread: ours ([\d.]+) ms, model garden ([\d.]+) ms, '
      r'ours uint8 ([\d.]+) ms$', output))


def test_frontier_plot_draws_the_runs(tmp_path):
  for seed, (seconds, accuracy) in enumerate([(30, 0.9), (40, 0.92)], 1):
    run_dir = tmp_path / f'row_s{seed}'
    run_dir.mkdir()
    (run_dir / 'run_summary.json').write_text(json.dumps(
        {'wall_seconds': seconds, 'eval_accuracy': accuracy}))
  out = tmp_path / 'frontier.png'
  output = _run('frontier_plot', [f'--runs_dir={tmp_path}', '--rows=row',
                                  f'--out={out}'])
  assert output == f'{out}\n'
  assert out.read_bytes().startswith(b'\x89PNG')


def test_suite_time_reads_a_durations_report(tmp_path):
  log = tmp_path / 'suite.log'
  log.write_text('1.50s call     tests/unit/test_a.py::test_x\n'
                 '0.50s setup    tests/unit/test_a.py::test_x\n'
                 '3.00s call     tests/e2e/test_b.py::test_y@mpirun\n'
                 '===== 2 passed in 4.00s =====\n')
  output = _run('suite_time', [str(log)])
  assert ('| `tests/e2e/test_b.py::test_y` | 3.0 |\n'
          '| `tests/unit/test_a.py::test_x` | 2.0 |') in output
  assert ("2 passed in 4 s wall; the tests' own times add up to 5 s (1.25 "
          'workers busy on average)') in output


def test_suite_cpu_records_a_run_as_plugin_and_reports_it(tmp_path):
  (tmp_path / 'test_tiny.py').write_text('def test_one():\n  pass\n')
  (tmp_path / 'pytest.ini').write_text('[pytest]\n')
  records_dir = tmp_path / 'records'
  plugin = runner.spawn_tool(
      'pytest', ['-p', 'benchmarks.suite_cpu', '-p', 'no:cacheprovider', '-q',
                 '-c', str(tmp_path / 'pytest.ini'), str(tmp_path)],
      env={'SUITE_CPU_DIR': str(records_dir)}, timeout=300)
  assert plugin.returncode == 0, plugin.stdout + plugin.stderr
  output = _run('suite_cpu', [str(records_dir)])
  # One worker's log ('main', or the xdist worker's name this test ran in).
  assert re.search(r'^\| \S+ \| 1 \| ', output, re.MULTILINE), output
  assert '| `test_tiny.py::test_one` |' in output


def test_goodput_probe_reads_the_speed_past_the_first_step_lines():
  from benchmarks import goodput_under_faults  # pylint: disable=g-import-not-at-top
  log = ('[1,0]<stderr>:23:59:10 I step 10/200 | loss 2.3\n'
         '[1,0]<stderr>:23:59:40 I step 20/200 | loss 2.3\n'  # Tracing.
         '[1,0]<stderr>:23:59:50 I step 30/200 | loss 2.2\n'
         '23:59:55 I saved checkpoint ckpt-30\n'
         '[1,0]<stderr>:00:00:10 I step 50/200 | loss 2.1\n')
  # From step 30 at 23:59:50 to step 50 at 00:00:10: 20 steps in 20 s.
  assert goodput_under_faults.speed_from_log(log) == 1.0
  with pytest.raises(RuntimeError, match='logged 2 step lines'):
    goodput_under_faults.speed_from_log(log[:log.index('23:59:50')])


def test_deploy_without_exports_says_what_to_give(tmp_path):
  runner.assert_one_line_error(runner.spawn_tool('benchmarks.deploy', []),
                               'give --exports_dir', '--resnet50')
  runner.assert_one_line_error(
      runner.spawn_tool('benchmarks.deploy', [f'--exports_dir={tmp_path}']),
      f'no exported model in --exports_dir={tmp_path}',
      'python -m resnet_keras.export')


@pytest.mark.skipif(importlib.util.find_spec('torch') is not None,
                    reason='PyTorch is installed here: the message for its '
                    'absence cannot show')
def test_pytorch_reference_without_pytorch_says_how_to_get_it():
  result = runner.spawn_tool('benchmarks.pytorch_reference', ['--depth=10'])
  runner.assert_one_line_error(
      result, 'benchmarks.pytorch_reference needs PyTorch: pip install torch==')
  assert result.returncode == 2


def test_benchmarks_import_no_test_module():
  """What the benchmarks share with the tests lives in testbed/ or the
  package, so that moving a test helper cannot break a benchmark."""
  importing = []
  for name in SCRIPTS:
    with open(os.path.join(runner.REPO_ROOT, 'benchmarks', f'{name}.py')) as f:
      if re.search(r'^\s*(from|import) tests\b', f.read(), re.MULTILINE):
        importing.append(name)
  assert not importing, importing
