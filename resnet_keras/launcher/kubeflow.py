"""An external launcher started this rank (a Kubeflow MPIJob's mpirun,
--kubernetes_run): the trainer runs in-process as that rank. Its hosts
(MULTI_HLS_IPS) count the workers, for the batch checks; nobody is asked
anything before it starts."""

from typing import Dict, Mapping, Sequence

from resnet_keras.launcher import commands as launch
from resnet_keras.launcher import placement
from resnet_keras.launcher.launch_config import LaunchConfig


class Kubeflow(placement.Placement):

  guard_refused = ('not applied under Kubernetes (give the pods a '
                   'NetworkPolicy)')

  @classmethod
  def chosen(cls, cfg: LaunchConfig, environ: Mapping[str, str],
             hosts: Sequence[str]) -> bool:
    del environ, hosts
    return cfg.kubernetes_run

  def command(self, trainer_argv: Sequence[str], hosts: Sequence[str],
              extra_env: Dict[str, str],
              hosts_per_machine: int) -> launch.Launch:
    del hosts, hosts_per_machine  # The MPIJob placed this rank.
    return launch.Launch(argv=list(trainer_argv), env=extra_env, files={},
                         notes=[])
