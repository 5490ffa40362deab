"""The launch layer: demo_resnet_keras.py's library (main.launch). Every
module here is the launcher's alone; what the trainer shares with it is in
common/ (the worker contract, the batch rule, host names).

launch_config.py  the launcher's options, declared once
presets.py      the reference's optimizer presets (from the recipes)
job.py          a job across its attempts: hosts, batch split, restarts
elastic.py      the batch split of a job on fewer (or more) hosts
regrowth.py     a job that grows back while it runs, when a dropped host
                answers again (membership.py: when one may rejoin)
host_checks.py  the hosts checked before each attempt (preflight.py: the
                checks over ssh)
placement.py    the seam to the ways workers start: this_host.py,
                ssh_hosts.py, kubeflow.py, slurm.py (one module a way,
                a scheduler's whole); registry.py picks one
commands.py     the commands it builds, as data: mpirun, the tf.data
                service's servers
input_servers.py  the tf.data service's servers on other hosts
fanout.py       a command on many hosts over ssh, at most 64 at once
port_guard.py   the job's ports closed to all but its hosts (port_rules.py:
                the iptables rules as shell commands)
supervisor.py   the attempts run: output read, restarts
failures.py     an attempt's record, and its failure named in one line
main.py         flags -> configs -> placement -> job -> dry run or run
"""
