"""The soak's report: a row per job as it ends, the table by placement,
backend and fault at the end, and the last line with the exit code."""

import collections
import statistics
from typing import List, Sequence, Tuple

from testbed.soak.invariants import (ENDED_WELL, JobRecord, broken_invariants,
                                     check_data)

ROW = ('{job:>3} {placement:<9} {backend:<21} {fault:<17} {moment:<10} '
       '{outcome:<9} {landed:>6} {named:>6} {first_step:>6} {recovery:>6} '
       '{redone:>6} {goodput:>7} {drift:>5}  {broken}')


def _fmt(value, spec='.1f') -> str:
  return '-' if value is None else format(value, spec)


def _landed(records: Sequence[JobRecord]) -> str:
  """'landed/planned' faults over `records`."""
  landed = sum(f.landed is True for r in records for f in r.faults)
  return f'{landed}/{sum(len(r.plan.faults) for r in records)}'


def _recoveries(records: Sequence[JobRecord]) -> List[float]:
  return [f.recovery for r in records for f in r.faults
          if f.landed and f.recovery is not None]


def row(record: JobRecord) -> str:
  plan = record.plan
  redone = sum(r - s for r, s in record.resumes) if record.resumes else None
  return ROW.format(
      job=plan.index, placement=plan.placement, backend=plan.backend,
      fault=plan.fault + ('*' if len(plan.faults) > 1 else ''),
      moment=plan.moment, outcome=record.outcome, landed=_landed([record]),
      named=_fmt(record.seconds_to_named),
      first_step=_fmt(record.restart_to_step),
      recovery=_fmt(max(_recoveries([record]), default=None)),
      redone=_fmt(redone, 'd'),
      goodput=_fmt(record.goodput, '.2f'), drift=_fmt(record.drift, '.2f'),
      broken='; '.join(broken_invariants(record)) or 'ok')


HEADER = ROW.format(job='#', placement='placement', backend='backend',
                    fault='fault', moment='moment', outcome='outcome',
                    landed='landed', named='named', first_step='1st',
                    recovery='recov', redone='redone', goodput='goodput',
                    drift='drift', broken='invariants')


def summary_table(records: Sequence[JobRecord]) -> List[str]:
  """placement x backend x fault: jobs, ended well, named, hangs, left
  processes, lost data, medians."""
  groups = collections.defaultdict(list)
  for record in records:
    plan = record.plan
    groups[(plan.placement, plan.backend, plan.fault)].append(record)
  lines = ['placement  backend                fault             jobs well '
           'named hang left lost  med_named med_1st med_redone goodput '
           'landed max_recov']
  median = lambda values: (statistics.median(values) if values else None)
  for (placement, backend, fault), group in sorted(groups.items()):
    lines.append(
        f'{placement:<10} {backend:<22} {fault:<17} {len(group):>4} '
        f'{sum(r.outcome in ENDED_WELL and not broken_invariants(r) for r in group):>4} '
        f'{sum(r.outcome == "named" for r in group):>5} '
        f'{sum(r.outcome == "HANG" for r in group):>4} '
        f'{sum(bool(r.left_processes) for r in group):>4} '
        f'{sum(bool(check_data(r)) for r in group):>4}  '
        f'{_fmt(median([r.seconds_to_named for r in group if r.seconds_to_named is not None])):>9} '
        f'{_fmt(median([r.restart_to_step for r in group if r.restart_to_step is not None])):>7} '
        f'{_fmt(median([sum(a - b for a, b in r.resumes) for r in group if r.resumes])):>10} '
        f'{_fmt(median([r.goodput for r in group if r.goodput is not None]), ".2f"):>7} '
        f'{_landed(group):>6} '
        f'{_fmt(max(_recoveries(group), default=None)):>9}')
  return lines


def verdict(records: Sequence[JobRecord], compare_weights: bool
            ) -> Tuple[str, int]:
  """The soak's last line and exit code: 1 if any invariant broke."""
  broken = [r for r in records if broken_invariants(r)]
  line = (f'{len(records)} jobs, {len(broken)} with a broken invariant; '
          f'faults landed {_landed(records)}')
  if not compare_weights:
    line += '; weights not compared (--no_reference)'
  return line, 1 if broken else 0
