#!/usr/bin/env bash
# Writes Fashion-MNIST as a raw image tree (ImageNet layout) in $1, installing
# Debian's dataset-fashion-mnist first if it is missing. Does nothing when the
# tree is already complete. Shared by the Fashion-MNIST demos.
set -euo pipefail
cd "$(dirname "$0")/.."
IDX_DIR=/usr/share/datasets/fashion-mnist
if [ ! -f "$IDX_DIR/train-images-idx3-ubyte.gz" ]; then
  echo "Installing Debian's dataset-fashion-mnist..."
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
python3 -m scripts.fashion_mnist_to_images --idx_dir "$IDX_DIR" --out_dir "$1"
