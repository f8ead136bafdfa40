"""Pax's image classification: ResNet, ViT and Pax's MNIST CNN, image inputs, experiments."""

__version__ = "0.1.0"
