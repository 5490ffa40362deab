"""Short programs that use resnet_keras as a library (run them from the
repository's root as modules: python -m examples.NAME)."""
