#!/usr/bin/env bash
# Real data out of the box: train ResNet-18 on Fashion-MNIST end to end.
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

# ResNet-18 at the native 28x28 with the small-image stem (3x3/1 conv + max
# pool: the first stage sees 14x14, not 7x7), bf16 (matmul convolutions, the
# CPU default), uint8 images normalised on the device, gentle crops (the
# ImageNet minimum of 5% of the area destroys 28x28 objects; 85% keeps
# train and test scales close), and no central crop at evaluation (the
# garments fill their frame). One evaluation, at the end.
python3 resnet_ctl_imagenet_main.py -dd "$WORK/tfrecords" -md "$WORK/model" --clean \
  --resnet_depth 18 --stem small --image_size 28 -bs 128 -te 6 -ebe 6 \
  --steps_per_loop 100 --log_steps 100 -dt bf16 -dlit uint8 \
  --lr_schedule cosine --base_learning_rate 0.4 --warmup_epochs 0.5 \
  --weight_decay 5e-4 --label_smoothing 0.1 --train_crop_min_area 0.85 \
  --eval_crop_fraction 1.0 --training_dataset_cache "$@"

python3 - "$WORK/model/run_summary.json" "$start" <<'PY'
import json, sys, time
s = json.load(open(sys.argv[1]))
minutes = (time.time() - int(sys.argv[2])) / 60
print(f"Fashion-MNIST test accuracy: {100 * s['eval_accuracy']:.2f}% on "
      f"{s['eval_examples']} test images after {s['epochs_completed']:.0f} "
      f"epochs ({minutes:.1f} min end to end)")
PY
