"""What the tests and the benchmarks build on this machine to run on: a
cluster of network-namespace hosts (cluster.py), free loopback ports
(ports.py). Neither is part of the installed package."""
