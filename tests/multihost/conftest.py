"""The multi-host tests' cluster (testbed/cluster.py): built once per test
module with the module's CLUSTER_HOSTS hosts on a subnet of its own (from
its CLUSTER_SUBNETS, so that two modules' clusters never collide), and
healed after each test that breaks it."""

import os

import pytest

from testbed import cluster as cluster_lib


@pytest.fixture(scope='module')
def cluster(request):
  num_hosts = request.module.CLUSTER_HOSTS
  subnets = request.module.CLUSTER_SUBNETS
  hosts = cluster_lib.Cluster(
      num_hosts,
      state_dir=f'/run/resnet_keras_cluster{num_hosts}_{os.getpid()}',
      subnet_index=subnets[os.getpid() % len(subnets)]).start()
  try:
    yield hosts
  finally:
    hosts.stop()


@pytest.fixture
def healthy(cluster):  # pylint: disable=redefined-outer-name
  """The cluster, healed after the test: links up, no firewall, no job."""
  yield cluster
  for host in cluster.hosts:
    cluster.restore_link(host)
    cluster.clear_firewall(host)
    cluster.kill_host_processes(host)
