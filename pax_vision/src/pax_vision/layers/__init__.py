"""The backbones of pax-vision's classifiers: each maps float images ``[B, H, W, C]`` to
features ``[B, F]`` and says how many FLOPs one image's forward pass costs."""
