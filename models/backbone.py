"""CNN backbones for DETR: a feature map (B, C, H / stride, W / stride) from images (B, C_in, H, W).

* :class:`ResNet50` — ResNet-50 (He et al., CVPR 2016, Table 1: bottleneck blocks [3, 4, 6, 3]),
  written here because torchvision cannot be installed beside this torch. As in DETR, its batch
  norms are frozen (:class:`FrozenBatchNorm2d`: fixed statistics and affine parameters, held as
  buffers) and it returns the last stage, C5: 2048 channels at stride 32. Module and buffer
  names follow torchvision's, so its state_dict keys are torchvision's.
* :class:`ConvBackbone` — a small stack of 3x3 convolutions (conv -> batch norm -> ReLU),
  trained from scratch, for the small DETR trained here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine parameters (DETR's ``FrozenBatchNorm2d``).

    ``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`` per channel; all four
    are buffers, so an optimiser never updates them and they count as no parameters.
    """

    weight: torch.Tensor  # the four buffers registered below (nn.Module types their reads Tensor | Module)
    bias: torch.Tensor
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.eps = eps

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)  # present in a torchvision checkpoint
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H, W)."""
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here, as torchvision) -> 1x1 (x4 channels), plus shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = FrozenBatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = FrozenBatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = FrozenBatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), FrozenBatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ResNet-50 without its pooling and classifier: images (B, 3, H, W) -> C5 (B, 2048, H/32, W/32).

    Weights are initialised as torchvision does (Kaiming normal, fan-out, for convolutions);
    the frozen batch norms start as the identity.
    """

    num_channels = 2048
    stride = 32
    layer1: nn.Sequential  # the four stages, set by name in __init__
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, in_channels: int = 3, layers: Sequence[int] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        for stage, (blocks, width) in enumerate(zip(layers, (64, 128, 256, 512), strict=True), start=1):
            stride = 1 if stage == 1 else 2
            stage_blocks = []
            for block in range(blocks):
                stage_blocks.append(Bottleneck(channels, width, stride if block == 0 else 1))
                channels = width * Bottleneck.expansion
            setattr(self, f"layer{stage}", nn.Sequential(*stage_blocks))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))  # (B, 64, H/4, W/4)
        x = self.layer1(x)  # (B, 256, H/4, W/4)
        x = self.layer2(x)  # (B, 512, H/8, W/8)
        x = self.layer3(x)  # (B, 1024, H/16, W/16)
        return self.layer4(x)  # (B, 2048, H/32, W/32)


class ConvBackbone(nn.Module):
    """3x3 conv -> batch norm -> ReLU, repeated: images (B, C_in, H, W) -> (B, channels[-1], H/stride, W/stride).

    Args:
        in_channels: 1 (grayscale) or 3 (RGB).
        channels: output channels of each layer.
        strides: stride of each layer (1 or 2); the total stride is their product.
    """

    def __init__(self, in_channels: int, channels: Sequence[int], strides: Sequence[int]) -> None:
        super().__init__()
        if len(channels) != len(strides):
            raise ValueError(f"{len(channels)} channel counts for {len(strides)} strides")
        layers: list[nn.Module] = []
        previous = in_channels
        for width, stride in zip(channels, strides, strict=True):
            layers += [nn.Conv2d(previous, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width)]
            layers.append(nn.ReLU(inplace=True))
            previous = width
        self.body = nn.Sequential(*layers)
        self.num_channels = previous
        self.stride = int(torch.tensor(list(strides)).prod())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)  # (B, channels[-1], H / stride, W / stride)


def build_backbone(
    name: str, in_channels: int, channels: Sequence[int] = (), strides: Sequence[int] = ()
) -> ResNet50 | ConvBackbone:
    """``"resnet50"`` or ``"conv"`` (with ``channels`` and ``strides``).

    Raises:
        ValueError: an unknown backbone name.
    """
    if name == "resnet50":
        return ResNet50(in_channels)
    if name == "conv":
        return ConvBackbone(in_channels, channels, strides)
    raise ValueError(f"unknown backbone {name!r}; known: 'resnet50', 'conv'")
