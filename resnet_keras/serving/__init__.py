"""A trained network for other programs: the exports of a run.

  contract.py     what every export takes and returns, and its file names
  saved_model.py  the SavedModel writer (classifier and feature vector)
  converters.py   the ONNX and TFLite writers
  readers.py      any export loaded back: probabilities of pixels or files
  deployment.py   a run's checkpoints exported in the formats asked for

The command line is resnet_keras/export.py; training's own export at its
end is saved_model.export_run.
"""
