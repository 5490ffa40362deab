"""The model: the ResNets and what only they use.

  network.py    the ResNets (v1.5 of depth 10 to 152, the keras.applications
                ones) and the training model that wraps one for the input
                pipeline; nothing of data/ imported
  layers.py     its own layers: matmul convolutions, the fused and bitwise
                ReLUs, drop path in the residual adds, the blur, group norm
  stem_init.py  --stem_init=pca: the stem's filters fitted to the training
                images' patches
"""
