"""The reference CNN and the ViT's conv stem: shapes, sizes, configs."""

from __future__ import annotations

import itertools

import pytest
import torch

from models import cnn
from models.vit import CONFIGS, ViT, ViTConfig, build


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("name", "shape"), [("cifar10", (3, 32, 32)), ("digits", (1, 8, 8))])
def test_cnn_maps_images_to_logits(name: str, shape: tuple[int, int, int]) -> None:
    model = cnn.build(name).eval()
    logits = model(torch.randn(5, *shape))
    assert logits.shape == (5, 10)
    assert torch.isfinite(logits).all()


def cnn_parameters(in_channels: int, channels: list[int], classes: int = 10) -> int:
    """3x3 kernels without bias, BatchNorm scale and shift, the linear head."""
    widths = [in_channels, *channels]
    convs = sum(9 * a * b for a, b in itertools.pairwise(widths))
    return convs + 2 * sum(channels) + channels[-1] * classes + classes


def test_cnn_sizes_match_the_vits_they_are_compared_with() -> None:
    assert count(cnn.build("cifar10")) == cnn_parameters(3, [32, 64, 128, 128, 256, 256]) == 1_129_514
    assert count(cnn.build("digits")) == cnn_parameters(1, [16, 32, 64]) == 24_058
    # Against the ViTs: CIFAR-10 1.13M vs 1.91M, digits 24k vs 26k.
    assert count(build("cifar10")) == 1_906_154
    assert abs(count(cnn.build("digits")) - count(build("digits"))) < 3_000


def test_cnn_pools_where_configured() -> None:
    model = cnn.CNN(cnn.CNNConfig(channels=(4, 8, 8), pool_after=(0, 2)))
    assert model.features(torch.randn(1, 3, 32, 32)).shape == (1, 8, 8, 8)  # 32 -> 16 -> 8
    with pytest.raises(ValueError, match="pool_after"):
        cnn.CNNConfig(channels=(4,), pool_after=(1,))


def test_cnn_config_round_trips_through_json_values() -> None:
    config = cnn.CONFIGS["cifar10"]
    assert cnn.CNNConfig(**cnn.config_dict(config)) == config
    with pytest.raises(ValueError, match="unknown CNN config"):
        cnn.build("imagenet")


def test_conv_stem_keeps_one_token_per_patch() -> None:
    config = CONFIGS["cifar10"]
    model = ViT(config).eval()
    tokens = model.embed(torch.randn(2, 3, 32, 32))
    assert tokens.shape == (2, 1 + 16, 192)  # 4x4 patches of 8x8 pixels + the class token
    logits, attention = model(torch.randn(2, 3, 32, 32), return_attention=True)
    assert logits.shape == (2, 10) and attention.shape == (2, 6, 3, 17, 17)
    # log2(8) = 3 stride-2 convs (32, 64, 128 channels), then a 1x1 conv to the width.
    convs = [m for m in model.patch_embed if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.stride[0]) for c in convs] == [(32, 2), (64, 2), (128, 2), (192, 1)]
    # A patch-4 conv stem has two stride-2 convs and 8x8 tokens.
    small = ViT(ViTConfig(image_size=32, patch_size=4, hidden_size=64, depth=1, num_heads=2, stem="conv"))
    assert small.embed(torch.randn(1, 3, 32, 32)).shape == (1, 1 + 64, 64)


def test_conv_stem_is_additive() -> None:
    assert CONFIGS["digits"].stem == "patch" and CONFIGS["vit-b16"].stem == "patch"
    assert isinstance(build("digits").patch_embed, torch.nn.Conv2d)
    with pytest.raises(ValueError, match="power-of-two"):
        ViTConfig(image_size=24, patch_size=3, stem="conv")
