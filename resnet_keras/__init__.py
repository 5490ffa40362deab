"""resnet_keras: ResNet image classifiers trained with a custom loop (orbit)."""
