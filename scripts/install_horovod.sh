#!/usr/bin/env bash
# Installs OpenMPI and Horovod 0.28.1 built against the installed TensorFlow.
#
# The published sdist does not build with TF 2.20 as is:
#  - pip's build isolation hides TensorFlow from Horovod's CMake, so we build
#    with --no-build-isolation after TensorFlow is installed;
#  - horovod/tensorflow/xla_mpi_ops.cc includes
#    tensorflow/compiler/xla/client/xla_builder.h, which TF 2.20 moved to
#    xla/hlo/builder/xla_builder.h; we patch that one include.
# CPU-only build with MPI and Gloo (~3 minutes on 2 cores). Idempotent: does
# nothing when mpirun and horovod.tensorflow already work.
set -euo pipefail
cd "$(dirname "$0")/.."
HOROVOD_VERSION=0.28.1
PY=${PYTHON:-python3}

have_horovod() {
  command -v mpirun >/dev/null &&
    "$PY" -c "import horovod.tensorflow" >/dev/null 2>&1
}
if have_horovod; then
  echo "Horovod $("$PY" -c 'import horovod; print(horovod.__version__)') and $(command -v mpirun) already installed"
  exit 0
fi

missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
[ -f /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -n "$(find /usr/lib /usr/include -name mpi.h -path '*openmpi*' -print -quit 2>/dev/null)" ] || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "Installing ${missing[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

"$PY" -m pip install --quiet --disable-pip-version-check -r requirements.txt
"$PY" -m pip install --quiet --disable-pip-version-check \
  setuptools wheel packaging psutil pyyaml cloudpickle cffi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
  --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"
sed -i 's#tensorflow/compiler/xla/client/xla_builder.h#xla/hlo/builder/xla_builder.h#' \
  "$src/horovod/tensorflow/xla_mpi_ops.cc"
echo "Building Horovod $HOROVOD_VERSION against TensorFlow $("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  MAKEFLAGS="-j$(nproc)" \
  "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  --no-build-isolation "$src"
have_horovod || { echo "error: Horovod built but 'import horovod.tensorflow' or mpirun still fails" >&2; exit 1; }
horovodrun --check-build
