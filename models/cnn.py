"""A small VGG-style CNN (Simonyan & Zisserman 2015, with BatchNorm), the reference beside the ViT.

It is the inductive-bias control of the ViT experiments: locality and translation
equivariance built in, so it learns from little data what the ViT must learn from data
(Dosovitskiy et al. 2021, Section 4.3). Each layer is a 3x3 conv (no bias) + BatchNorm +
ReLU, with a 2x2 max-pool after the layers listed in ``pool_after``; then global average
pooling and a linear head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class CNNConfig:
    """Hyper-parameters of the CNN.

    Attributes:
        in_channels: 1 (grayscale) or 3 (RGB).
        num_classes: outputs of the head.
        channels: output channels of each 3x3 conv layer, in order.
        pool_after: indices (0-based) of the layers followed by a 2x2 max-pool (stride 2).
        dropout: dropout before the head.
    """

    in_channels: int = 3
    num_classes: int = 10
    channels: tuple[int, ...] = (32, 64, 128, 128, 256, 256)
    pool_after: tuple[int, ...] = (1, 2, 4)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        # JSON round trips (checkpoints) give lists; keep the config hashable.
        object.__setattr__(self, "channels", tuple(self.channels))
        object.__setattr__(self, "pool_after", tuple(self.pool_after))
        if any(i < 0 or i >= len(self.channels) for i in self.pool_after):
            raise ValueError(f"pool_after {self.pool_after} names layers outside 0..{len(self.channels) - 1}")


CONFIGS: dict[str, CNNConfig] = {
    # CIFAR-10: 32x32 RGB -> 16 -> 8 -> 4; 1.13M parameters, ~0.15 GFLOPs per image.
    "cifar10": CNNConfig(),
    # Digits: 8x8 grayscale -> 4x4; 24k parameters, about the digits ViT's 26k.
    "digits": CNNConfig(in_channels=1, channels=(16, 32, 64), pool_after=(1,)),
}


class CNN(nn.Module):
    """``forward(images)``: float32 (B, C, H, W) -> logits (B, num_classes), any H, W >= 2^pools."""

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        c_in = config.in_channels
        for i, c_out in enumerate(config.channels):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
            if i in config.pool_after:
                layers.append(nn.MaxPool2d(2))
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(c_in, config.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.features(images)  # (B, channels[-1], H / 2^pools, W / 2^pools)
        return self.head(self.dropout(x.mean(dim=(2, 3))))  # (B, num_classes)


def build(name: str, **overrides: Any) -> CNN:
    """A CNN from a named config (``CONFIGS``), with fields overridden."""
    if name not in CONFIGS:
        raise ValueError(f"unknown CNN config {name!r}; known: {sorted(CONFIGS)}")
    return CNN(replace(CONFIGS[name], **overrides))


def config_dict(config: CNNConfig) -> dict[str, Any]:
    """The config as plain JSON-able values (for checkpoints)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
