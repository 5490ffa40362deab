"""The launch layer: demo_resnet_keras.py's library (main.launch).

options.py      the launcher's options, declared once
presets.py      the reference's optimizer presets (from the recipes)
job.py          a job across its attempts: hosts, batch split, restarts
host_checks.py  the hosts checked before each attempt
placement.py    the seam to the ways workers start: this_host.py,
                ssh_hosts.py, kubeflow.py, slurm.py
input_servers.py  the tf.data service's servers on other hosts
fanout.py       a command on many hosts over ssh, at most 64 at once
main.py         flags -> configs -> placement -> job -> dry run or run
"""
