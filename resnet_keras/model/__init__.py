"""The model: the ResNets, their layers and the PCA stem."""
