"""Progressive resizing's image-size schedule against hand-computed sizes."""

from resnet_keras.data import progressive_resizing
from resnet_keras.config import RunConfig


def test_image_size_rises_in_multiples_between_its_epochs():
  # Fashion-MNIST's 28 px from 16 over epochs 2..5 in steps of 4.
  sizes = [progressive_resizing.image_size_at(e, 16, 28, 2, 5, 4)
           for e in range(8)]
  assert sizes == [16, 16, 16, 20, 24, 28, 28, 28]
  # ImageNet's 160 -> 224 over epochs 0..4 in multiples of 32, rounded to
  # the nearest (176 and 208 are halfway: to the even multiple, 192).
  sizes = [progressive_resizing.image_size_at(e, 160, 224, 0, 4, 32)
           for e in range(6)]
  assert sizes == [160, 192, 192, 192, 224, 224]
  # Never outside [start, end], even when the end is not a multiple.
  assert progressive_resizing.image_size_at(1, 20, 30, 0, 2, 8) == 24
  assert all(20 <= progressive_resizing.image_size_at(e, 20, 30, 0, 9, 16) <= 30
             for e in range(10))
  # A ramp of no epochs: a jump at its epoch.
  assert [progressive_resizing.image_size_at(e, 16, 32, 2, 2, 4)
          for e in range(4)] == [16, 16, 32, 32]


def test_image_size_for_run_follows_the_flags():
  plain = RunConfig(image_size=64, train_epochs=4)
  assert [progressive_resizing.image_size_for_run(plain, e)
          for e in range(4)] == [64] * 4
  # Default epochs: the whole run, ending at --image_size in the last one;
  # default multiple: 4 below 128 px.
  ramp = RunConfig(image_size=64, train_epochs=5,
                   progressive_resize_start_size=48)
  assert [progressive_resizing.image_size_for_run(ramp, e)
          for e in range(5)] == [48, 52, 56, 60, 64]
  big = RunConfig(image_size=192, train_epochs=16,
                  progressive_resize_start_size=160,
                  progressive_resize_epochs=(11, 13))
  # 176: halfway, to the even 192.
  assert [progressive_resizing.image_size_for_run(big, e)
          for e in (10, 11, 12, 13, 15)] == [160, 160, 192, 192, 192]
