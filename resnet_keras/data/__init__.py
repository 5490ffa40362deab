"""Input data: synthetic batches and image datasets, as tf.data pipelines.

  datasets.py            which dataset a run reads, its size, and the
                         per-replica pipelines (and a data error's one line)
  imagenet.py            the ImageNet-format TFRecords: shards, sizes, reader
  imagenet_record.py     one record's format, for reader and writer
  imagenet_converter.py  raw JPEG folders to records (preprocess_imagenet.py)
  fashion_mnist.py       Fashion-MNIST's IDX files as a raw image tree
  cifar.py               CIFAR-10/100 from their binary files
  synthetic.py           one random batch, repeated
  preprocessing.py       normalisation, the seeded training order, repeated
                         augmentation
  augment.py             RandAugment, random erasing, mixup and CutMix
  progressive_resizing.py  the training image size by epoch, and the input
                         switched to it
  input_service.py       a tf.data service's client and servers
  service.py             the servers' command line
                         (python -m resnet_keras.data.service)
"""
