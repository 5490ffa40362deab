"""The randomized fault soak (python -m testbed.soak): real tiny jobs on the
namespace cluster (testbed/cluster.py) and its Slurm (testbed/slurm.py),
each hit by one or two faults drawn from a seed at a moment drawn from it,
then checked against invariants. Its modules: plan.py (the catalogue and
the jobs a seed draws) and invariants.py (the checks), both pure; jobs.py
(a job's start, state and processes under each placement), faults.py (what
each fault does) and evidence.py (reading a job's log and model
directory); runner.py runs each job through them (References: the
uninterrupted run of each layout, which a faulted job is held to), and
report.py writes its rows, table and last line.
docs/testing.md has the catalogue and the bound."""
