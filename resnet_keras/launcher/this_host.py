"""Workers on this host: the trainer itself for one worker, mpirun for
more (each bound to its share of the physical cores)."""

from typing import Dict, Sequence

from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import placement


class ThisHost(placement.Placement):

  def command(self, trainer_argv: Sequence[str], hosts: Sequence[str],
              extra_env: Dict[str, str],
              hosts_per_machine: int) -> launch.Launch:
    return self._one_process_or_mpirun(trainer_argv, hosts, extra_env,
                                       hosts_per_machine)
