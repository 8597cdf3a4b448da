"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021).

Pre-norm, as in the paper's Eqs. 1-4::

    z0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                      (2)
    z_l = MLP(LN(z'_l)) + z'_l                             (3)
    y = LN(z_L^0)                                          (4)

followed by a linear head on the class token. The MLP is Linear -> GELU -> Linear with
expansion ``mlp_ratio`` (4 in the paper). A block has 12 d^2 + 13 d parameters at ratio 4.

With ``distillation`` the model is DeiT's (Touvron et al., "Training data-efficient image
transformers & distillation through attention", ICML 2021, Sec. 5): a distillation token
follows the class token, ``[x_class; x_distil; patches] + E_pos``, and has its own linear
head, trained on the teacher's predictions; at inference the two heads' logits are averaged
(Sec. 5.2, "joint classifiers"), as transformers' ``DeiTForImageClassificationWithTeacher``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ViTConfig:
    """Hyper-parameters of a ViT (the paper's Table 1 names in brackets).

    Attributes:
        image_size: input height = width, in pixels.
        patch_size: side of a square patch, in pixels; must divide ``image_size * upsample``.
        in_channels: 1 (grayscale) or 3 (RGB).
        num_classes: outputs of the head.
        hidden_size: token width d [Hidden size D].
        depth: number of encoder blocks [Layers].
        num_heads: attention heads; must divide ``hidden_size`` [Heads].
        mlp_ratio: MLP width / hidden_size [MLP size / D].
        dropout: dropout after the embeddings, in attention and in the MLP (0 at inference).
        position_embedding: learned 1-D position embeddings (off only for the ablation).
        init: "timm": truncated normal (std 0.02) for linear layers, class token and position
            embeddings (the ViT/DeiT practice); "torch": PyTorch's default layer initialisation
            and N(0, 1) class token and position embeddings (the reference digits tutorial).
        stem: how patches become tokens. "patch": one linear projection of each patch (the
            paper's Eq. 1, a conv with kernel = stride = patch_size). "conv": a small
            convolutional stem, the paper's hybrid (Section 3.1) in the form of Xiao et al.,
            "Early Convolutions Help Transformers See Better" (NeurIPS 2021): log2(patch_size)
            3x3 stride-2 convolutions with BatchNorm and ReLU, then a 1x1 convolution to
            ``hidden_size``. Token i still covers patch i of the grid.
        stem_channels: channels of the conv stem's first convolution (doubled at each next one).
        distillation: DeiT's distillation token and head (Touvron et al. 2021, Sec. 5).
        upsample: the image is enlarged by this factor (bilinear, ``align_corners=False``) inside
            the model, before the stem, so that the grid is finer at the same input size: DeiT's
            fine-tuning at a higher resolution (Touvron et al. 2021, Sec. 6, 224 -> 384), with
            the input the server prepares unchanged. 1: none.
    """

    image_size: int = 224
    patch_size: int = 16
    in_channels: int = 3
    num_classes: int = 1000
    hidden_size: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    position_embedding: bool = True
    init: Literal["timm", "torch"] = "timm"
    stem: Literal["patch", "conv"] = "patch"
    stem_channels: int = 32
    distillation: bool = False
    upsample: int = 1

    @property
    def prefix_tokens(self) -> int:
        """Tokens before the patch grid: the class token, and DeiT's distillation token."""
        return 1 + self.distillation

    @property
    def grid(self) -> int:
        """Patches along each side, image_size * upsample / patch_size."""
        return self.image_size * self.upsample // self.patch_size

    @property
    def num_patches(self) -> int:
        """N = grid^2 = (image_size * upsample / patch_size)^2."""
        return self.grid**2

    def __post_init__(self) -> None:
        if self.upsample < 1:
            raise ValueError(f"upsample must be a whole factor >= 1, not {self.upsample}")
        if self.image_size * self.upsample % self.patch_size:
            raise ValueError(
                f"patch_size {self.patch_size} does not divide image_size {self.image_size} x upsample {self.upsample}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads {self.num_heads} does not divide hidden_size {self.hidden_size}")
        if self.stem == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"the conv stem needs a power-of-two patch_size >= 2, not {self.patch_size}")


CONFIGS: dict[str, ViTConfig] = {
    # The reference digits model: 8x8 grayscale, 2x2 patches (16 tokens + class token).
    "digits": ViTConfig(
        image_size=8,
        patch_size=2,
        in_channels=1,
        num_classes=10,
        hidden_size=32,
        depth=2,
        num_heads=4,
        init="torch",
    ),
    # The CIFAR-10 photo model, a hybrid sized for CPU training: 32x32 RGB, a conv stem of three
    # stride-2 convs (32, 64, 128 channels) making 8x8-pixel patches (16 tokens + class token),
    # width 192, 6 blocks, 3 heads, MLP x2; 1.9M parameters, ~2x the training speed of the same
    # ViT on 4x4 patches (64 tokens) at width 128.
    "cifar10": ViTConfig(
        image_size=32,
        patch_size=8,
        in_channels=3,
        num_classes=10,
        hidden_size=192,
        depth=6,
        num_heads=3,
        mlp_ratio=2.0,
        stem="conv",
        stem_channels=32,
    ),
    # The paper's Table 1 (Ti and S from DeiT, Touvron et al. 2021).
    "vit-ti16": ViTConfig(hidden_size=192, depth=12, num_heads=3),
    "vit-s16": ViTConfig(hidden_size=384, depth=12, num_heads=6),
    "vit-b16": ViTConfig(hidden_size=768, depth=12, num_heads=12),
}


def conv_stem(in_channels: int, hidden_size: int, patch_size: int, channels: int) -> nn.Sequential:
    """The convolutional stem (Xiao et al. 2021): (B, C, H, W) -> (B, hidden_size, H / p, W / p).

    log2(patch_size) blocks of 3x3 stride-2 conv (no bias) + BatchNorm + ReLU, channels
    ``channels``, ``2 * channels``, ...; then a 1x1 conv to ``hidden_size``.
    """
    layers: list[nn.Module] = []
    c_in, c_out = in_channels, channels
    for _ in range(patch_size.bit_length() - 1):
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        c_in, c_out = c_out, 2 * c_out
    layers.append(nn.Conv2d(c_in, hidden_size, kernel_size=1))
    return nn.Sequential(*layers)


class Attention(nn.Module):
    """Multi-head self-attention with a fused (q, k, v) projection.

    The ``qkv`` weight (3d, d) stacks q, k, v in that order, the layout of
    ``nn.MultiheadAttention.in_proj_weight``.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args: x (B, T, d). Returns (B, T, d) and, if asked, the weights (B, heads, T, T)."""
        B, T, d = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, heads, T, head_dim)
        if return_attention:
            weights = torch.softmax((q @ k.transpose(-2, -1)) * self.head_dim**-0.5, dim=-1)  # (B, heads, T, T)
            out = F.dropout(weights, self.dropout, self.training) @ v
        else:
            weights = None
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, T, d)  # (B, T, d)
        return self.proj(out), weights


class Block(nn.Module):
    """One pre-norm encoder block: Eqs. (2) and (3)."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0) -> None:
        super().__init__()
        mlp_size = int(hidden_size * mlp_ratio)
        self.norm1 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, dropout)
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.fc1 = nn.Linear(hidden_size, mlp_size)
        self.fc2 = nn.Linear(mlp_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args: x (B, T, d). Returns (B, T, d) and the attention weights (B, heads, T, T) or None."""
        attended, weights = self.attn(self.norm1(x), return_attention)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(self.norm2(x))))))
        return x, weights


class ViT(nn.Module):
    """The Vision Transformer classifier.

    ``forward(images)`` takes float32 (B, C, H, W) with H = W = ``image_size`` and returns
    logits (B, num_classes). ``forward(images, return_attention=True)`` also returns every
    block's attention weights stacked, (B, depth, heads, T, T) with T = P + N tokens: the
    P = ``config.prefix_tokens`` prefix tokens (token 0 the class token, token 1 DeiT's
    distillation token) before the N patch tokens. With ``distillation``, ``forward`` returns
    the mean of the two heads' logits, and ``forward(images, heads=True)`` both of them,
    ``(class_logits, distillation_logits)``, for training.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        if config.stem == "conv":
            self.patch_embed: nn.Module = conv_stem(config.in_channels, d, config.patch_size, config.stem_channels)
        else:
            self.patch_embed = nn.Conv2d(config.in_channels, d, kernel_size=config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if config.distillation else None
        tokens = config.num_patches + config.prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, d)) if config.position_embedding else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            Block(d, config.num_heads, config.mlp_ratio, config.dropout) for _ in range(config.depth)
        )
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, config.num_classes)
        self.head_dist = nn.Linear(d, config.num_classes) if config.distillation else None
        self._init_weights()

    def _init_weights(self) -> None:
        tokens = [t for t in (self.cls_token, self.dist_token, self.pos_embed) if t is not None]
        if self.config.init == "torch":  # layers keep PyTorch's defaults
            for parameter in tokens:
                nn.init.normal_(parameter, std=1.0)
            return
        for parameter in tokens:
            nn.init.trunc_normal_(parameter, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Eq. (1): images (B, C, H, W) -> tokens (B, P + N, d), the P prefix tokens first."""
        if self.config.upsample > 1:  # (B, C, H * upsample, W * upsample)
            images = F.interpolate(images, scale_factor=self.config.upsample, mode="bilinear", align_corners=False)
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, d)
        batch = patches.shape[0]
        prefix = [self.cls_token.expand(batch, -1, -1)]
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(batch, -1, -1))
        tokens = torch.cat([*prefix, patches], dim=1)  # (B, P + N, d)
        if self.pos_embed is not None:
            tokens = tokens + self.pos_embed
        return self.dropout(tokens)

    def features(self, images: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, list]:
        """Every token after the final LayerNorm, (B, P + N, d) float32.

        Returns:
            ``(tokens, attentions)``: attentions is every block's (B, heads, P + N, P + N)
            weights when ``return_attention``, else a list of None.
        """
        x = self.embed(images)
        attentions = []
        for block in self.blocks:
            x, weights = block(x, return_attention)
            attentions.append(weights)
        return self.norm(x), attentions

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The image's representation from :meth:`features`' tokens, (B, d): the class token
        (Eq. 4's y); with distillation, the mean of the class and distillation tokens, the
        representation whose two heads' mean is the DeiT classifier."""
        if self.dist_token is None:
            return tokens[:, 0]
        return (tokens[:, 0] + tokens[:, 1]) / 2

    def pooled(self, images: torch.Tensor, return_attention: bool = False) -> tuple[torch.Tensor, list]:
        """:meth:`pool` of :meth:`features`: ``(pooled (B, d), attentions)``."""
        tokens, attentions = self.features(images, return_attention)
        return self.pool(tokens), attentions

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The classifier on :meth:`features`' tokens, (B, num_classes): the head on the class
        token (Eq. 4); with distillation, the mean of the class and distillation heads."""
        if self.head_dist is None:
            return self.head(tokens[:, 0])
        return (self.head(tokens[:, 0]) + self.head_dist(tokens[:, 1])) / 2

    def forward(
        self, images: torch.Tensor, return_attention: bool = False, heads: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        tokens, attentions = self.features(images, return_attention)
        if heads:
            if self.head_dist is None:
                raise ValueError("heads=True needs a ViT with a distillation token (distillation=True)")
            return self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])
        logits = self.logits(tokens)  # (B, num_classes)
        if return_attention:
            return logits, torch.stack(attentions, dim=1)  # (B, depth, heads, P + N, P + N)
        return logits


def resample_position_embedding(pos_embed: torch.Tensor, prefix_tokens: int, grid: int) -> torch.Tensor:
    """Position embeddings (1, P + g^2, d) for a g x g grid -> (1, P + grid^2, d): the P prefix
    tokens' kept, the patches' resized bicubically as a (d, g, g) image (DeiT's fine-tuning at a
    higher resolution, Touvron et al. 2021, Sec. 6; timm's ``resample_abs_pos_embed``).

    Raises:
        ValueError: the patch tokens do not form a square grid.
    """
    prefix, patches = pos_embed[:, :prefix_tokens], pos_embed[:, prefix_tokens:]
    side = round(patches.shape[1] ** 0.5)
    if side * side != patches.shape[1]:
        raise ValueError(f"{patches.shape[1]} patch tokens are not a square grid")
    if side == grid:
        return pos_embed
    image = patches.reshape(1, side, side, -1).permute(0, 3, 1, 2)  # (1, d, g, g)
    resized = F.interpolate(image, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat([prefix, resized.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)], dim=1)


def build(name: str, **overrides: Any) -> ViT:
    """A ViT from a named config (``CONFIGS``), with fields overridden, e.g. ``num_classes=10``."""
    if name not in CONFIGS:
        raise ValueError(f"unknown ViT config {name!r}; known: {sorted(CONFIGS)}")
    return ViT(replace(CONFIGS[name], **overrides))


def config_dict(config: ViTConfig) -> dict[str, Any]:
    """The config as plain JSON-able values (for checkpoints)."""
    return asdict(config)
