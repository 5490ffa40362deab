"""Hand-made soak plans and job records (testbed/soak/plan.py,
invariants.py) for the soak's unit tests: a job that kept every
invariant, changed field by field."""

import dataclasses

from testbed.soak.invariants import FaultRecord, JobRecord, Restart
from testbed.soak.plan import JobPlan


def plan(**changes) -> JobPlan:
  base = JobPlan(index=0, placement='ssh', backend='horovod',
                 faults=(('kill_rank', 'mid_step'),), delay=0.5, victim=1,
                 steps=24)
  return dataclasses.replace(base, **changes)


def fault(name='kill_rank', moment='mid_step', **changes) -> FaultRecord:
  """A fault that landed: the process it killed gone."""
  fields = dict(at=30.0, did='pid 4242', landed=True,
                evidence='pid 4242 gone')
  fields.update(changes)
  return FaultRecord(name, moment, **fields)


def record(**changes) -> JobRecord:
  fields = dict(plan=plan(), outcome='completed', bound=300,
                resumes=[(10, 8)], restarts=[Restart((4, 8), 8, True)],
                readable_before=[4, 8],
                readable_after=[4, 8, 12, 16, 20, 24],
                files_before={'ckpt-4.index': 'a', 'ckpt-8.index': 'b'},
                files_after={'ckpt-4.index': 'a', 'ckpt-8.index': 'b',
                             'ckpt-12.index': 'c'},
                summary_steps=24, weights='w', reference_weights='w',
                restarts_logged=1,
                summary_restarts=1, summary_world_sizes=1,
                faults=[fault()])
  fields.update(changes)
  return JobRecord(**fields)
