"""What a Slurm job tells its processes, and what the launcher asks Slurm:
the allocation in the environment (SLURM_JOB_ID, the compressed node
lists, tasks per node), each node's address, the nodes a job holds now
(a job submitted with --no-kill keeps running without a failed node), and
the job's requeue. The launcher (resnet_keras/launcher/slurm.py) and the
trainer's record of a scheduled run (resnet_keras/scheduler.py) read it.
"""

import re
import subprocess
from typing import List, Mapping, Optional, Sequence, Tuple

from common import launch
from common.errors import UsageError

JOB_ID_VAR = 'SLURM_JOB_ID'
_BRACKETS = re.compile(r'^([^\[]*)\[([^\]]*)\](.*)$')


def in_allocation(environ: Mapping[str, str]) -> bool:
  return bool(environ.get(JOB_ID_VAR))


def expand_nodelist(nodelist: str) -> List[str]:
  """Slurm's compressed host list ('s[1-3,7]', 'a1,b[01-02]',
  'r[1-2]-n[1-2]') as the node names, in order."""
  nodes = []
  for item in _top_level_items(nodelist):
    match = _BRACKETS.match(item)
    if not match:
      if '[' in item or ']' in item:
        raise _unreadable(nodelist)
      nodes.append(launch.check_host(item, f'the Slurm node list '
                                           f'{nodelist!r}'))
      continue
    prefix, ranges, rest = match.groups()
    for number in _numbers(ranges, nodelist):
      nodes += expand_nodelist(prefix + number + rest)
  return nodes


_TRAILING_NUMBER = re.compile(r'^(.*?)(\d+)$')


def compress_nodelist(nodes: Sequence[str]) -> str:
  """`nodes` in Slurm's compressed form ('n1,n2,n3,n7' -> 'n[1-3,7]'), in
  their order: expand_nodelist gives them back, each number at its width.
  srun reads it as Slurm writes it; 1,000 names would be ~6 KB."""
  groups = []  # [prefix, [[first, last, width], ...]] per run of a prefix.
  for node in nodes:
    match = _TRAILING_NUMBER.match(node)
    if not match:
      groups.append([node, []])
      continue
    prefix, digits = match.groups()
    number = int(digits)
    if not groups or groups[-1][0] != prefix or not groups[-1][1]:
      groups.append([prefix, [[number, number, len(digits)]]])
      continue
    ranges = groups[-1][1]
    first, last, width = ranges[-1]
    if number == last + 1 and str(number).zfill(width) == digits:
      ranges[-1][1] = number
    else:
      ranges.append([number, number, len(digits)])
  return ','.join(_group(prefix, ranges) for prefix, ranges in groups)


def _group(prefix: str, ranges) -> str:
  """One item of a compressed list: a name, or a prefix and its ranges."""
  spans = [str(first).zfill(width) if first == last else
           f'{str(first).zfill(width)}-{str(last).zfill(width)}'
           for first, last, width in ranges]
  if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
    return prefix + spans[0]
  return f'{prefix}[{",".join(spans)}]' if spans else prefix


def _unreadable(nodelist: str) -> UsageError:
  return UsageError(f'cannot read the Slurm node list {nodelist!r}: '
                    'expected node names and ranges such as n1,n[2-4,7]')


def _top_level_items(nodelist: str) -> List[str]:
  items, depth, start = [], 0, 0
  for i, char in enumerate(nodelist):
    depth += {'[': 1, ']': -1}.get(char, 0)
    if depth not in (0, 1):  # A ']' before its '[', or brackets nested.
      raise _unreadable(nodelist)
    if char == ',' and depth == 0:
      items.append(nodelist[start:i])
      start = i + 1
  if depth:
    raise _unreadable(nodelist)
  items.append(nodelist[start:])
  return [item for item in items if item]


def _numbers(ranges: str, nodelist: str) -> List[str]:
  numbers = []
  for part in ranges.split(','):
    first, dash, last = part.partition('-')
    if not first.isdigit() or (dash and not last.isdigit()):
      raise _unreadable(nodelist)
    # Slurm pads each number to the width of the range's first.
    numbers += [str(n).zfill(len(first))
                for n in range(int(first), int(last or first) + 1)]
  return numbers


def tasks_per_node(value: str) -> List[int]:
  """SLURM_TASKS_PER_NODE ('2(x3),1') as one count per node."""
  counts = []
  for part in value.split(','):
    match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
    if not match:
      raise UsageError(f'cannot read SLURM_TASKS_PER_NODE={value!r}')
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def node_addresses(nodes: Sequence[str]) -> List[str]:
  """Each node's address as Slurm knows it (its NodeAddr); their names
  where Slurm cannot be asked (a dry run away from it)."""
  done, answer = _scontrol('show', 'node', ','.join(nodes))
  found = dict(re.findall(r'NodeName=(\S+).*?NodeAddr=(\S+)', answer, re.S)
               if done else [])
  return [found.get(node, node) for node in nodes]


def step_nodes(environ: Mapping[str, str]) -> List[str]:
  """The nodes of the step this process is a task of (a batch script, in
  no step: the job's, as it was allocated)."""
  return expand_nodelist(environ.get('SLURM_STEP_NODELIST') or
                         environ.get('SLURM_JOB_NODELIST', ''))


def _scontrol(*args: str) -> Tuple[bool, str]:
  """(whether scontrol did it, its answer or why not)."""
  try:
    answer = subprocess.run(['scontrol', *args], capture_output=True,
                            text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired) as e:
    return False, str(e)
  if answer.returncode:
    return False, (answer.stderr.strip() or
                   f'scontrol exited with code {answer.returncode}')
  return True, answer.stdout


def job_nodes(job_id: str) -> Optional[List[str]]:
  """The nodes job `job_id` holds now (a job submitted with --no-kill
  loses a failed node and runs on), or None where Slurm cannot tell."""
  done, answer = _scontrol('show', 'job', '--oneliner', job_id)
  found = done and re.search(r'(?:^|\s)NodeList=(\S+)', answer)
  return expand_nodelist(found.group(1)) if found else None


def requeue(job_id: str) -> Optional[str]:
  """Puts job `job_id` back in the queue (it starts again from its batch
  script, SLURM_RESTART_COUNT one higher); None, or why Slurm refused."""
  done, answer = _scontrol('requeue', job_id)
  return None if done else answer
