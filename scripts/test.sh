#!/usr/bin/env bash
# Installs the project's dependencies (Python packages, OpenMPI, Horovod)
# and runs the whole test suite.
# This is the README's test command, and CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt \
  -r requirements-test.txt
# OpenMPI + Horovod (built against our TensorFlow), so the 2-process tests
# run for real. Does nothing when already installed.
./scripts/install_horovod.sh
# The multi-host tests build hosts as network namespaces with their own sshd
# (tests/cluster.py); they need root and these Debian packages.
if [ "$(id -u)" -eq 0 ]; then
  missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh >/dev/null || missing+=(openssh-client)
  command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
  command -v nsenter >/dev/null || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing ${missing[*]} for the multi-host tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
python3 -m pytest tests -q "$@"
