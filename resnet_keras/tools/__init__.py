"""The tools' libraries. Their command lines stand at the package's top
(`python -m resnet_keras.validate`, ..., and the console scripts): thin,
over these and serving/.

  scoring.py             a run's checkpoints or exports scored on its
                         validation data (validate.py; average.py)
  checkpoint_average.py  checkpoints averaged into one, and scored
                         (average.py)
  tool_flags.py          the options several tools share: --checkpoint,
                         --data_dir, --eval_flip, --output_dir, --saved_model
"""
