"""Every way of starting workers, in the order a launch picks them: the
first whose options and environment are present (`Placement.chosen`).
A new placement is its module and its place here.
"""

from typing import Mapping, Optional, Tuple, Type

from common import worker_contract
from resnet_keras.launcher import kubeflow
from resnet_keras.launcher import slurm
from resnet_keras.launcher import ssh_hosts
from resnet_keras.launcher import this_host
from resnet_keras.launcher.launch_config import LaunchConfig
from resnet_keras.launcher.placement import Placement

# A scheduler's allocation first (it says where the job runs), then an
# external launcher's rank, the hosts of MULTI_HLS_IPS, and this host.
PLACEMENTS = (slurm.Slurm, kubeflow.Kubeflow, ssh_hosts.SshHosts,
              this_host.ThisHost)


def placement_for(cfg: LaunchConfig, environ: Mapping[str, str],
                  use_horovod: bool = False) -> Placement:
  """How this launch's workers start, from its options and environment."""
  hosts = worker_contract.hosts(environ)
  kind = next(kind for kind in PLACEMENTS
              if kind.chosen(cfg, environ, hosts))
  return kind.create(cfg, environ, hosts, use_horovod)


def batch_script_of(cfg: LaunchConfig, environ: Mapping[str, str]
                    ) -> Optional[Tuple[Type[Placement], int]]:
  """The placement whose batch script this launch prints instead of
  running, and the script's nodes (None: the launch runs)."""
  for kind in PLACEMENTS:
    nodes = kind.batch_nodes(cfg, environ)
    if nodes:
      return kind, nodes
  return None
