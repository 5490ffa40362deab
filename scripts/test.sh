#!/usr/bin/env bash
# Installs the project's dependencies (Python packages, OpenMPI, Horovod)
# and runs the test suite on all cores (pytest-xdist, up to 4 workers: one
# more than the cores for the full suite; set TEST_WORKERS to choose). This
# is the README's test command, and CI runs exactly this.
#   ./scripts/test.sh            everything (what CI runs): tests/unit,
#                                tests/e2e, tests/processes, tests/multihost
#   ./scripts/test.sh --quick    tests/unit and tests/e2e without the tests
#                                marked slow (pytest.ini): functions and
#                                modules, and the in-process runs and short
#                                command lines under 8 s each; not
#                                tests/processes (multi-worker jobs, signals,
#                                logical CPUs, environment read at start-up)
#                                nor tests/multihost (the namespace cluster)
# Other arguments go to pytest (e.g. tests/unit/test_config.py, -k name);
# named files or folders replace the default ones (--quick still leaves out
# the slow tests among them).
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
paths=(tests)
if [ "${1:-}" = "--quick" ]; then
  shift
  select=(-m "not slow")
  paths=(tests/unit tests/e2e)
fi
python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt \
  -r requirements-test.txt -r requirements-deploy.txt
# OpenMPI + Horovod (built against our TensorFlow), so the 2-process tests
# run for real. Does nothing when already installed.
./scripts/install_horovod.sh
# The multi-host tests build hosts as network namespaces with their own sshd
# (testbed/cluster.py); they need root and these Debian packages.
if [ "$(id -u)" -eq 0 ]; then
  missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh >/dev/null || missing+=(openssh-client)
  command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
  command -v nsenter >/dev/null || missing+=(util-linux)
  # A real Slurm on the same hosts (testbed/slurm.py).
  [ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || missing+=(slurmd)
  command -v srun >/dev/null || missing+=(slurm-client)
  [ -x /usr/sbin/munged ] || missing+=(munge)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing ${missing[*]} for the multi-host tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
# The default folders unless the arguments name test files or directories.
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then paths=(); break; fi
done
# The full suite gets one worker more than the cores: its multi-process and
# multi-host tests wait (failure timeouts, restarts, processes starting) and
# the extra worker fills those waits. On 2 cores, 3 workers kept the CPUs
# 84-85% busy against 77% with 2: the suite in 9% less time for the same CPU
# (benchmarks/HISTORY.md, fifteenth session). --quick and named tests keep
# one worker per core: they were not measured with more.
workers=$(nproc)
budget=()
if [ "${paths[*]:-}" = tests ] && [ ${#select[@]} -eq 0 ]; then
  workers=$(( workers + 1 ))
  # The full suite in its time budget, scaled by this machine's measured
  # pace (tests/support/budget.py).
  budget=(--suite-budget)
fi
workers=${TEST_WORKERS:-$(( workers < 4 ? workers : 4 ))}
# loadgroup: the tests of one xdist_group (one mpirun job at a time; a
# module's shared runs) stay in one worker, the rest go test by test.
# A stuck run ends by itself, naming the tests it was running, once no test
# has ended for longer than any may take (tests/support/deadlines.py); this
# limit is the last resort should pytest itself hang (exit 124), generous
# for a busy machine's full suite.
timeout --kill-after=60 150m \
  python3 -m pytest "${paths[@]}" -q -n "$workers" --dist loadgroup \
  "${select[@]}" "${budget[@]}" "$@"
