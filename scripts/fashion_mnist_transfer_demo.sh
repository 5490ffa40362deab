#!/usr/bin/env bash
# Transfer learning on Fashion-MNIST: pretrain ResNet-18 on classes 0-4
# (t-shirt, trouser, pullover, dress, coat; 30,000 images), then learn
# classes 5-9 (sandal, shirt, sneaker, bag, ankle boot) from only
# $FINETUNE_PER_CLASS images each, three ways with the same budget:
#
#   scratch    random initialisation
#   frozen     --pretrained_checkpoint --freeze_backbone (only the head trains)
#   finetune   --pretrained_checkpoint (everything trains)
#
# and print their accuracy on the 5,000 test images of classes 5-9.
# The two image trees are symlinks into the raw tree of fashion_mnist_demo.sh
# ($FMNIST_DIR/raw, made if missing); outputs go to $TRANSFER_DIR. Extra
# arguments go to every training run. $FINETUNE_PER_CLASS (100) and
# $FINETUNE_EPOCHS (20) set the fine-tuning data and budget.
set -euo pipefail
cd "$(dirname "$0")/.."
RAW=${FMNIST_DIR:-data/fashion_mnist}/raw
WORK=${TRANSFER_DIR:-data/fashion_mnist_transfer}
PER_CLASS=${FINETUNE_PER_CLASS:-100}
EPOCHS=${FINETUNE_EPOCHS:-20}
start=$(date +%s)

./scripts/fashion_mnist_raw.sh "$RAW"

# tree DIR PER_CLASS CLASS...: DIR/{train,validation}/<class> linking to the
# raw tree; PER_CLASS > 0 keeps only that many training images per class.
tree() {
  local dir=$1 per_class=$2; shift 2
  rm -rf "$dir" && mkdir -p "$dir/train" "$dir/validation"
  for class in "$@"; do
    ln -s "$(realpath "$RAW/validation/$class")" "$dir/validation/$class"
    if [ "$per_class" -eq 0 ]; then
      ln -s "$(realpath "$RAW/train/$class")" "$dir/train/$class"
    else
      mkdir "$dir/train/$class"
      local images=("$(realpath "$RAW/train/$class")"/*.png)
      ln -s -t "$dir/train/$class" "${images[@]:0:$per_class}"
    fi
  done
}
tree "$WORK/raw_0-4" 0 00_tshirt_top 01_trouser 02_pullover 03_dress 04_coat
tree "$WORK/raw_5-9" "$PER_CLASS" 05_sandal 06_shirt 07_sneaker 08_bag 09_ankle_boot
for part in 0-4 5-9; do
  rm -rf "$WORK/tfrecords_$part"
  python3 preprocess_imagenet.py --raw_data_dir "$WORK/raw_$part" \
    --local_scratch_dir "$WORK/tfrecords_$part" --train_shards 8 \
    --validation_shards 2
done

# resnet_keras/configs/fashion_mnist_resnet18.yaml (full ResNet-18, small stem at 28x28,
# bf16 where fast, gentle crops); one epoch to pretrain.
COMMON=(--config fashion_mnist_resnet18 --clean)
python3 resnet_ctl_imagenet_main.py "${COMMON[@]}" -dd "$WORK/tfrecords_0-4" \
  -md "$WORK/pretrain" -te 1 -ebe 1 --enable_checkpoint_and_export "$@"

# Few images: batch 50, $FINETUNE_EPOCHS epochs (10 steps each with 100 per
# class).
for run in scratch frozen finetune; do
  case $run in
    scratch) extra=() ;;
    frozen) extra=(--pretrained_checkpoint "$WORK/pretrain" --freeze_backbone) ;;
    finetune) extra=(--pretrained_checkpoint "$WORK/pretrain") ;;
  esac
  python3 resnet_ctl_imagenet_main.py "${COMMON[@]}" -dd "$WORK/tfrecords_5-9" \
    -md "$WORK/$run" -bs 50 -te "$EPOCHS" -ebe "$EPOCHS" --steps_per_loop 10 \
    --log_steps 50 --base_learning_rate 0.2 "${extra[@]}" "$@"
done

python3 - "$WORK" "$start" "$PER_CLASS" <<'PY'
import json, os, sys, time
work, start, per_class = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
summary = lambda run: json.load(open(os.path.join(work, run, 'run_summary.json')))
pre = summary('pretrain')
print(f"pretrained on classes 0-4: {100 * pre['eval_accuracy']:.2f}% "
      f"({pre['wall_seconds']:.0f} s)")
print(f"classes 5-9 from {per_class} training images each, "
      f"{summary('scratch')['train_steps']} steps:")
for run in ('scratch', 'frozen', 'finetune'):
  s = summary(run)
  print(f"  {run:<9} {100 * s['eval_accuracy']:6.2f}% on {s['eval_examples']} "
        f"test images ({s['wall_seconds']:.0f} s)")
print(f"{(time.time() - start) / 60:.1f} min end to end")
PY
