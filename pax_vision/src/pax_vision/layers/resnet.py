"""ResNets as Pax's ``imagenet_resnets`` builds them (He et al., v1.5: a bottleneck's stride on
its 3x3 convolution), with synchronised batch norm and zero-initialised residual scales.

Depth selects the block and the blocks per stage; sizes are data (``DEPTHS``). The entry is a
7x7 stride-2 convolution, batch norm, ReLU and 3x3 stride-2 max pooling; stages 2-4 halve the
resolution; the features are the global average of the last stage.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_transformer import BatchNorm
from pax_vision.layers.conv import conv, conv_flops, feature_map

# depth -> (block kind, blocks per stage); channels double per stage from ``width``.
DEPTHS: dict[int, tuple[str, tuple[int, ...]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
EXPANSION = {"basic": 1, "bottleneck": 4}


class ResidualBlock(nn.Module):
    """A basic block (two 3x3 convolutions) or a bottleneck (1x1 down to ``channels / 4``, 3x3
    with the stride, 1x1 up), each convolution followed by batch norm; the last norm's scale
    starts at 0; a 1x1 projection (with the stride) on the shortcut when the shape changes."""

    kind: str
    channels: int  # output channels
    strides: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        if self.kind == "basic":
            convs = [(self.channels, 3, self.strides), (self.channels, 3, 1)]
        else:
            inner = self.channels // EXPANSION["bottleneck"]
            convs = [(inner, 1, 1), (inner, 3, self.strides), (self.channels, 1, 1)]
        y = x
        for i, (features, kernel, strides) in enumerate(convs):
            y = conv(features, kernel, strides, dtype=self.dtype, name=f"conv_{i}")(y)
            last = i == len(convs) - 1
            y = BatchNorm(zero_scale=last, dtype=self.dtype, name=f"norm_{i}")(y, train)
            y = feature_map(y if last else nn.relu(y))
        shortcut = x
        if self.strides != 1 or x.shape[-1] != self.channels:
            shortcut = conv(self.channels, 1, self.strides, dtype=self.dtype,
                            name="shortcut")(x)
            shortcut = BatchNorm(dtype=self.dtype, name="shortcut_norm")(shortcut, train)
        return feature_map(nn.relu(y + shortcut))


class ResNet(nn.Module):
    """ResNet-``depth`` features: ``[B, H, W, C]`` images to ``[B, width x 8 x expansion]``."""

    depth: int = 50
    width: int = 64
    dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if self.depth not in DEPTHS:
            raise ValueError(f"ResNet depth must be one of {sorted(DEPTHS)}, got {self.depth}")
        super().__post_init__()

    @nn.nowrap
    def stages(self) -> list[tuple[int, int, int]]:
        """``(output channels, stride, blocks)`` of each stage."""
        kind, blocks = DEPTHS[self.depth]
        return [(self.width * 2**i * EXPANSION[kind], 1 if i == 0 else 2, n)
                for i, n in enumerate(blocks)]

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        kind = DEPTHS[self.depth][0]
        x = conv(self.width, 7, 2, dtype=self.dtype, name="entry")(x)
        x = feature_map(nn.relu(BatchNorm(dtype=self.dtype, name="entry_norm")(x, train)))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for s, (channels, strides, blocks) in enumerate(self.stages()):
            for b in range(blocks):
                x = ResidualBlock(kind, channels, strides if b == 0 else 1, self.dtype,
                                  name=f"stage_{s}_block_{b}")(x, train)
        return jnp.mean(x.astype(jnp.float32), axis=(1, 2))

    @nn.nowrap
    def feature_dims(self) -> int:
        return self.stages()[-1][0]

    @nn.nowrap
    def forward_flops(self, height: int, width: int, channels: int) -> float:
        """FLOPs of one image's forward pass: the convolutions (norms, ReLUs and pooling are a
        fraction of a percent and not counted, as in the papers' counts)."""
        height, width = -(-height // 2), -(-width // 2)
        flops = conv_flops(height, width, 7, channels, self.width)
        height, width, channels = -(-height // 2), -(-width // 2), self.width
        kind = DEPTHS[self.depth][0]
        for out, strides, blocks in self.stages():
            for b in range(blocks):
                stride = strides if b == 0 else 1
                out_h, out_w = -(-height // stride), -(-width // stride)
                if kind == "basic":
                    flops += conv_flops(out_h, out_w, 3, channels, out)
                    flops += conv_flops(out_h, out_w, 3, out, out)
                else:
                    inner = out // EXPANSION["bottleneck"]
                    flops += conv_flops(height, width, 1, channels, inner)
                    flops += conv_flops(out_h, out_w, 3, inner, inner)
                    flops += conv_flops(out_h, out_w, 1, inner, out)
                if stride != 1 or channels != out:
                    flops += conv_flops(out_h, out_w, 1, channels, out)
                height, width, channels = out_h, out_w, out
        return flops
