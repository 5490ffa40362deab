"""What the trainer and the launcher both use, and nothing that only one of
them does (the launcher's own modules are resnet_keras/launcher/, the
trainer's resnet_keras/; common/ never imports resnet_keras): the worker
contract (worker_contract.py, every variable the launcher and a scheduler
hand a worker), the batch rule (batch_rule.py), host names (hosts.py) and
Slurm's node lists (slurm.py), the environment before TensorFlow loads
(env.py), one-line errors and exit codes (errors.py, cli.py; Ctrl-C:
interrupts.py)."""
