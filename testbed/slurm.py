"""A real Slurm (Debian's slurmctld, slurmd and munge) on the hosts of a
network-namespace cluster (cluster.py): the controller on the first host,
a slurmd on each, one munged on a path socket that every namespace shares.

What it takes on one machine: each host's slurmd runs in that host's
network and UTS namespaces under its own node name; `ip netns exec` mounts
a fresh sysfs, so slurmd's cgroup detection needs `CgroupPlugin=cgroup/v1`
(with proctrack/linuxproc and task/none no cgroup is made); the hosts share
/tmp, so each node's TmpFS, spool, pid and log paths are its own (`%n`).
Nothing is written outside the cluster's state directory; the daemons are
ended with the cluster.
"""

import os
import shutil
import subprocess
import time
from typing import Dict, Sequence

from testbed.cluster import Cluster

_DAEMONS = ('munged', 'slurmctld', 'slurmd', 'srun', 'sbatch', 'scontrol',
            'sinfo')


def missing_tools() -> Sequence[str]:
  return [tool for tool in _DAEMONS
          if not shutil.which(tool) and not os.path.exists(f'/usr/sbin/{tool}')]


class SlurmCluster:
  """Slurm on `cluster`'s hosts: node names are the hosts' names, each
  with `cpus` CPUs, in one partition."""

  def __init__(self, cluster: Cluster, cpus: int = 2):
    self.cluster = cluster
    self.dir = os.path.join(cluster.state_dir, 'slurm')
    self.conf = os.path.join(self.dir, 'slurm.conf')
    self._cpus = cpus
    self._processes = []

  @property
  def env(self) -> Dict[str, str]:
    """What Slurm's commands need to find this cluster."""
    return {'SLURM_CONF': self.conf}

  def start(self, timeout: float = 60) -> 'SlurmCluster':
    os.makedirs(os.path.join(self.dir, 'state'), exist_ok=True)
    for host in self.cluster.hosts:
      for sub in ('spool', 'tmp'):
        os.makedirs(os.path.join(self.dir, host.name, sub), exist_ok=True)
    self._write_config()
    socket = os.path.join(self.dir, 'munge.socket')
    subprocess.run(['munged', f'--socket={socket}', '--force',
                    f'--pid-file={self.dir}/munged.pid',
                    f'--log-file={self.dir}/munged.log',
                    f'--seed-file={self.dir}/munge.seed'], check=True,
                   capture_output=True)
    env = {**os.environ, **self.env}
    first = self.cluster.hosts[0]
    self._processes.append(self._daemon(first, ['slurmctld', '-D', '-i'],
                                        'slurmctld.out', env))
    for host in self.cluster.hosts:
      self._processes.append(self._daemon(
          host, ['slurmd', '-D', '-N', host.name], f'{host.name}.out', env))
    self.wait_until_idle(timeout)
    return self

  def _daemon(self, host, argv, log, env) -> subprocess.Popen:
    with open(os.path.join(self.dir, log), 'w') as out:
      return self.cluster.popen(host, argv, env=env, stdout=out,
                                stderr=subprocess.STDOUT)

  def _write_config(self) -> None:
    hosts, d = self.cluster.hosts, self.dir
    lines = [
        'ClusterName=resnetkeras', f'SlurmctldHost={hosts[0].name}'
        f'({hosts[0].address})', 'SlurmUser=root', 'SlurmdUser=root',
        'AuthType=auth/munge', 'CryptoType=crypto/munge',
        f'AuthInfo=socket={d}/munge.socket', 'MpiDefault=none',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none',
        'SwitchType=switch/none', 'ReturnToService=2', 'SlurmdTimeout=10',
        'InactiveLimit=0', 'SchedulerType=sched/backfill',
        'SelectType=select/cons_tres', 'SelectTypeParameters=CR_Core',
        'JobAcctGatherType=jobacct_gather/none',
        'AccountingStorageType=accounting_storage/none',
        f'SlurmctldPidFile={d}/slurmctld.pid',
        f'SlurmctldLogFile={d}/slurmctld.log', f'StateSaveLocation={d}/state',
        f'SlurmdPidFile={d}/slurmd_%n.pid', f'SlurmdLogFile={d}/slurmd_%n.log',
        f'SlurmdSpoolDir={d}/%n/spool', f'TmpFS={d}/%n/tmp']
    lines += [f'NodeName={h.name} NodeAddr={h.address} CPUs={self._cpus} '
              'State=UNKNOWN' for h in hosts]
    lines.append(f'PartitionName=main Nodes={",".join(h.name for h in hosts)}'
                 ' Default=YES MaxTime=INFINITE State=UP')
    with open(self.conf, 'w') as f:
      f.write('\n'.join(lines) + '\n')
    with open(os.path.join(d, 'cgroup.conf'), 'w') as f:
      f.write('CgroupPlugin=cgroup/v1\n')

  def run(self, argv: Sequence[str], timeout: float = 60
          ) -> subprocess.CompletedProcess:
    """`argv` (a Slurm command) on the first host, as a user logged in
    there would run it."""
    return subprocess.run(
        self.cluster.enter(self.cluster.hosts[0]) + list(argv),
        env={**os.environ, **self.env}, capture_output=True, text=True,
        timeout=timeout)

  def wait_until_idle(self, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    want = f'idle {len(self.cluster.hosts)}'
    while True:
      answer = self.run(['sinfo', '-h', '-o', '%T %D'])
      if answer.stdout.strip() == want:
        return
      if time.monotonic() > deadline:
        raise RuntimeError(f'Slurm did not come up: sinfo says '
                           f'{answer.stdout.strip() or answer.stderr.strip()}'
                           f' (logs in {self.dir})')
      time.sleep(0.2)  # Polls sinfo until every node is idle.

  def heal(self, timeout: float = 180, steady: float = 3) -> None:
    """Every node idle again, and still so `steady` s later: a node a test
    set down or cut is resumed, and so is one slurmd drains a moment after
    its job ended ('Kill task failed': seen 0.7 s after the node was idle
    again, which left the next test's job pending for good). Returns as
    soon as that holds; `timeout` bounds a Slurm that never comes back."""
    deadline = time.monotonic() + timeout
    want = f'idle {len(self.cluster.hosts)}'
    idle_since = None
    while True:
      state = self.run(['sinfo', '-h', '-o', '%T %D']).stdout.strip()
      now = time.monotonic()
      if state != want:
        idle_since = None
        stuck = self.run(['sinfo', '-h', '-N', '-o', '%N', '-t',
                          'down,drain,fail']).stdout
        for node in sorted(set(stuck.split())):
          self.run(['scontrol', 'update', f'nodename={node}',
                    'state=resume'])
      elif idle_since is None:
        idle_since = now
      elif now - idle_since >= steady:
        return
      if now > deadline:
        raise RuntimeError(f'Slurm did not come back: sinfo says {state} '
                           f'after {timeout:.0f} s (logs in {self.dir})')
      time.sleep(0.5)

  def stop(self) -> None:
    for process in self._processes:
      process.kill()
      process.wait(timeout=10)
    self._processes = []
    subprocess.run(['pkill', '-f', f'munged --socket={self.dir}/'],
                   check=False)
