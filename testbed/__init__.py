"""What the tests and the benchmarks build on this machine to run on, none
of it part of the installed package. The fixture: a cluster of
network-namespace hosts (cluster.py), a real Slurm on it (slurm.py),
stand-ins for ssh, mpirun, srun and scontrol that make a cluster of
1,000 hosts on loopback (standins.py), free loopback ports (ports.py).
The program: the randomized fault soak, soak/ (python -m testbed.soak)."""
