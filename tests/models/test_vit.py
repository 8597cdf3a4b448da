"""The ViT of Dosovitskiy et al.: parameter counts and equivalence with PyTorch's encoder layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.vit import CONFIGS, Block, ViT, build


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("d", "expected"), [(32, 12_704), (768, 7_087_872)])
def test_block_parameters_are_12d2_plus_13d(d: int, expected: int) -> None:
    assert 12 * d * d + 13 * d == expected
    assert count(Block(d, num_heads=4)) == expected


def test_vit_b16_has_86_567_656_parameters() -> None:
    assert count(build("vit-b16", num_classes=1000)) == 86_567_656


@pytest.mark.parametrize("name", ["digits", "vit-ti16"])
def test_forward_shapes(name: str) -> None:
    config = CONFIGS[name]
    model = ViT(config).eval()
    x = torch.randn(3, config.in_channels, config.image_size, config.image_size)
    logits, attention = model(x, return_attention=True)
    tokens = config.num_patches + 1
    assert logits.shape == (3, config.num_classes)
    assert attention.shape == (3, config.depth, config.num_heads, tokens, tokens)
    assert torch.allclose(attention.sum(-1), torch.ones(()), atol=1e-5)  # rows are distributions
    assert torch.allclose(model(x), logits, atol=1e-5)  # the fused-attention path agrees


def test_block_equals_transformer_encoder_layer() -> None:
    torch.manual_seed(0)
    d, heads = 32, 4
    block = Block(d, heads).eval()
    for p in block.parameters():  # non-trivial values everywhere, biases and norms included
        nn.init.normal_(p, std=0.2)
    layer = nn.TransformerEncoderLayer(
        d,
        heads,
        dim_feedforward=4 * d,
        dropout=0.0,
        activation="gelu",
        norm_first=True,
        batch_first=True,
        layer_norm_eps=1e-6,
    ).eval()
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(block.attn.qkv.weight)
        layer.self_attn.in_proj_bias.copy_(block.attn.qkv.bias)
        layer.self_attn.out_proj.weight.copy_(block.attn.proj.weight)
        layer.self_attn.out_proj.bias.copy_(block.attn.proj.bias)
        layer.linear1.weight.copy_(block.fc1.weight)
        layer.linear1.bias.copy_(block.fc1.bias)
        layer.linear2.weight.copy_(block.fc2.weight)
        layer.linear2.bias.copy_(block.fc2.bias)
        for ours, theirs in ((block.norm1, layer.norm1), (block.norm2, layer.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
        x = torch.randn(5, 17, d)
        expected = layer(x)
        got, _ = block(x)
        got_explicit, _ = block(x, return_attention=True)
    assert (got - expected).abs().max().item() <= 1e-6
    assert (got_explicit - expected).abs().max().item() <= 1e-6


def test_position_embedding_can_be_switched_off() -> None:
    model = build("digits", position_embedding=False)
    assert model.pos_embed is None
    assert count(build("digits")) - count(model) == (CONFIGS["digits"].num_patches + 1) * 32


def test_deit_adds_a_distillation_token_and_head_and_averages_them() -> None:
    """DeiT (Touvron et al. 2021, Sec. 5): [class; distillation; patches], two heads, their mean."""
    torch.manual_seed(0)
    plain, deit = build("digits"), build("digits", distillation=True).eval()
    d, k, n = deit.config.hidden_size, deit.config.num_classes, deit.config.num_patches
    assert deit.config.prefix_tokens == 2 and plain.config.prefix_tokens == 1
    # one token, its position embedding, one more head
    assert count(deit) - count(plain) == d + d + (d * k + k)
    x = torch.randn(3, 1, 8, 8)
    logits, attention = deit(x, return_attention=True)
    assert attention.shape == (3, deit.config.depth, deit.config.num_heads, n + 2, n + 2)
    class_logits, distillation_logits = deit(x, heads=True)
    assert torch.allclose(logits, (class_logits + distillation_logits) / 2, atol=1e-6)
    tokens, _ = deit.features(x)
    pooled, _ = deit.pooled(x)
    assert torch.allclose(pooled, (tokens[:, 0] + tokens[:, 1]) / 2)
    assert torch.allclose(deit.head(tokens[:, 0]), class_logits, atol=1e-6)
    with pytest.raises(ValueError, match="distillation"):
        plain(x, heads=True)


def test_upsample_makes_the_grid_finer_at_the_same_input_size() -> None:
    model = build("cifar10", distillation=True, upsample=2).eval()
    assert model.config.grid == 8 and model.config.num_patches == 64
    assert model.pos_embed is not None and model.pos_embed.shape == (1, 2 + 64, 192)
    with torch.no_grad():
        logits, attentions = model(torch.randn(3, 3, 32, 32), return_attention=True)
    assert logits.shape == (3, 10) and attentions.shape == (3, 6, 3, 66, 66)
    with pytest.raises(ValueError, match="whole factor"):
        build("cifar10", upsample=0)
    with pytest.raises(ValueError, match="does not divide"):
        build("digits", patch_size=3, upsample=2)


def test_position_embeddings_resample_to_a_finer_grid_keeping_the_prefix() -> None:
    from models.vit import resample_position_embedding

    prefix = torch.randn(1, 2, 8)
    constant = torch.ones(1, 16, 8) * torch.arange(8.0)  # every patch the same embedding
    resampled = resample_position_embedding(torch.cat([prefix, constant], 1), 2, 8)
    assert resampled.shape == (1, 2 + 64, 8)
    assert torch.equal(resampled[:, :2], prefix)
    assert torch.allclose(resampled[:, 2:], torch.ones(1, 64, 8) * torch.arange(8.0), atol=1e-5)
    # a ramp along the columns stays a ramp: the corners keep their order
    ramp = torch.arange(4.0).repeat(4).view(1, 16, 1)
    fine = resample_position_embedding(torch.cat([prefix[..., :1], ramp], 1), 2, 8)[0, 2:, 0].view(8, 8)
    assert torch.all(fine[:, 1:] >= fine[:, :-1]) and fine[0, 0] < fine[0, -1]
    same = torch.randn(1, 18, 8)
    assert resample_position_embedding(same, 2, 4) is same
    with pytest.raises(ValueError, match="not a square grid"):
        resample_position_embedding(torch.randn(1, 17, 8), 2, 8)
