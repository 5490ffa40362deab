"""Launches resnet_ctl_imagenet_main.py: optimizer presets, then 1..N workers.

  python demo_resnet_keras.py -dt bf16 -dlit bf16 -bs 256 -te 90 -ebe 90
  python demo_resnet_keras.py --optimizer LARS -dt bf16
  python demo_resnet_keras.py --use_horovod --num_workers_per_hls 8 \\
      --optimizer LARS -dt bf16 -bs 256 -te 40 -ebe 40
  python demo_resnet_keras.py -ds multi_worker_mirrored \\
      --num_workers_per_hls 2 -bs 512
  MULTI_HLS_IPS=10.0.0.1,10.0.0.2 python demo_resnet_keras.py --use_horovod \\
      --num_workers_per_hls 8 --optimizer LARS
  python demo_resnet_keras.py ... --data_service_hosts h2,h3  # remote input
  python demo_resnet_keras.py ... --dry_run   # print the command, run nothing
  python demo_resnet_keras.py ... --dry_run --launcher=slurm --slurm_nodes 4 \\
      > job.sh                                # an sbatch script for the launch

Every flag of resnet_ctl_imagenet_main.py is accepted and forwarded as absl
read it (each value joined to its flag; a --flagfile read here).
--config NAME (resnet_keras/configs/NAME.yaml) fills in a recipe's values,
launcher settings included; then --optimizer LARS / SGD fill in their preset
hyperparameters (RMSProp has none); neither replaces a value given on the
command line (in any spelling), and a preset never replaces a recipe's
value. The trainer gets every filled-in value as a flag, so --dry_run shows
them all. With more than one worker in total (--num_workers_per_hls > 1 or
several MULTI_HLS_IPS hosts) the workers are started with mpirun;
they train with Horovod (--use_horovod; -bs per worker) or tf.distribute
(--distribution_strategy=multi_worker_mirrored; -bs global, each rank's
TF_CONFIG derived from its MPI rank). Environment: MULTI_HLS_IPS (the
hosts, comma-separated: the reference's name, kept for its command lines),
MPI_TCP_INCLUDE, DOCKER_SSHD_PORT (3022), MPI_ROOT, TF_BASE_PORT (2410).
Several hosts are checked (ssh, Python, TensorFlow, Horovod, the project,
ports) before anything starts. A failed job ends with one line naming the
lost rank or host; --max_restarts starts it again from the last checkpoint.
--min_hosts N makes the job elastic: hosts that fail the check (at the start
or at a restart) are left out while N remain, the global batch is re-split
over the workers left (--elastic_batch), and a host that passes again
rejoins at the next restart (resnet_keras/launcher/elastic.py).
--data_service_hosts starts a tf.data service (a dispatcher on the first
host, a data worker on each) over the same ssh before the job, points the
trainer at it and stops it when the job ends (resnet_keras/launcher/input_servers.py).
The exit code is the training job's (its last attempt's).
"""

import os
import sys

from common import env

env.prepare_tensorflow_environment()  # Before anything imports TensorFlow.

from absl import flags  # pylint: disable=g-import-not-at-top

from common import cli  # pylint: disable=g-import-not-at-top
from resnet_keras.launcher import main as launcher  # pylint: disable=g-import-not-at-top
from resnet_keras.launcher.launch_config import define_flags  # pylint: disable=g-import-not-at-top,unused-import


def main(argv):
  del argv  # The flags are parsed; sys.argv is what is forwarded.
  cli.configure_logging()
  return launcher.launch(sys.argv, flags.FLAGS, os.environ)


def run() -> None:
  """The command line (also the console script of pyproject.toml)."""
  cli.run_entry_point(main, define_flags)


if __name__ == '__main__':
  run()
