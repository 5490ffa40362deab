#!/usr/bin/env bash
# Real data out of the box: train a ResNet on Fashion-MNIST end to end.
#
#   Debian's dataset-fashion-mnist (70,000 28x28 images, 10 classes)
#   -> raw image tree in the ImageNet layout (scripts/fashion_mnist_to_images.py)
#   -> ImageNet-format TFRecords (preprocess_imagenet.py)
#   -> training + evaluation (resnet_ctl_imagenet_main.py)
#   -> prints the test accuracy.
#
# Extra arguments go to the trainer (e.g. -te 2 for a shorter run).
# Outputs live under $FMNIST_DIR (default data/fashion_mnist); reruns reuse the
# converted data and start training afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${FMNIST_DIR:-data/fashion_mnist}
start=$(date +%s)

python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt

./scripts/fashion_mnist_raw.sh "$WORK/raw"
python3 preprocess_imagenet.py --raw_data_dir "$WORK/raw" \
  --local_scratch_dir "$WORK/tfrecords" --train_shards 16 --validation_shards 4

# resnet_keras/configs/fashion_mnist_fast.yaml on every machine: a narrow
# ResNet-10 at the native 28x28, 3 epochs tuned for time to accuracy;
# --dtype auto trains in bf16 where the CPU has bf16 hardware, in fp32
# elsewhere, with the recipe's fp32 shape (its first log lines say which
# and why). $FMNIST_RECIPE picks another recipe.
recipe=${FMNIST_RECIPE:-fashion_mnist_fast}
python3 resnet_ctl_imagenet_main.py --config "$recipe" \
  -dd "$WORK/tfrecords" -md "$WORK/model" --clean "$@"

python3 - "$WORK/model/run_summary.json" "$start" <<'PY'
import json, sys, time
s = json.load(open(sys.argv[1]))
minutes = (time.time() - int(sys.argv[2])) / 60
print(f"Fashion-MNIST test accuracy: {100 * s['eval_accuracy']:.2f}% on "
      f"{s['eval_examples']} test images after {s['epochs_completed']:.0f} "
      f"epochs of {s['model']} in {s['dtype']} ({minutes:.1f} min end to "
      f"end on {s['runtime']['machine']})")
PY
