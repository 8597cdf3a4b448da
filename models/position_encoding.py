"""The 2-D sine position encoding of DETR (Carion et al., 2020, Sec. 3.2 and appendix A.3).

A generalisation of the Transformer's 1-D sine encoding to images: half the channels encode the
row, half the column, each as interleaved sin/cos of the position at ``num_pos_feats``
geometrically spaced frequencies. With ``normalize`` the positions are scaled to (0, 2 pi]
first, so the encoding of a feature map does not depend on its size in pixels.

DETR computes the positions from a padding mask: a cumulative sum over the valid pixels of
each row and column, normalised by the valid extent, so an image padded to a larger canvas
(a batch of mixed sizes, Carion et al. 2020, Sec. 4: "images ... padded") gets the same
encoding on its own pixels as alone. Without a mask every position is valid.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class PositionEmbeddingSine(nn.Module):
    """Sine position encoding of a feature map, as DETR's ``PositionEmbeddingSine``.

    Args:
        num_pos_feats: channels per axis; the encoding has ``2 * num_pos_feats`` channels
            (the transformer width d, so ``num_pos_feats = d / 2``).
        temperature: the longest wavelength's base (10000, as in "Attention is all you need").
        normalize: scale positions to (0, ``scale``] by the map's height and width.
        scale: the normalised range (2 pi).
    """

    def __init__(
        self, num_pos_feats: int = 64, temperature: float = 10000.0, normalize: bool = True, scale: float = 2 * math.pi
    ) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        self.scale = scale

    def forward(
        self, features: torch.Tensor, mask: torch.Tensor | None = None, extent: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The encoding of a feature map, float32 (B, 2 * num_pos_feats, H, W).

        Args:
            features: (B, C, H, W); only its shape is used.
            mask: bool (B, H, W), True on padding (DETR's convention); None: all valid. The
                valid region must be a top-left rectangle (padding bottom and right), as the
                server pads.
            extent: float (B, 2), what positions are normalised by, (rows, columns) in cells
                of this map, per image; None: DETR's, each image's valid extent (the last
                valid row and column are at ``scale``). A fixed frame of F pixels at stride s
                is ``F / s`` for every image (:class:`models.detr.DETR`'s ``fixed_frame``).

        Channels ``[0, num_pos_feats)`` encode the row (y), the rest the column (x), each as
        (sin f0, cos f0, sin f1, cos f1, ...). Padded positions get values too (the attention
        masks them out).
        """
        batch, _, height, width = features.shape
        device = features.device
        if mask is None:
            valid = torch.ones(batch, height, width, dtype=torch.float32, device=device)
        else:
            valid = (~mask).to(torch.float32)
        y_embed = valid.cumsum(1)  # (B, H, W): 1, 2, ... down each valid column
        x_embed = valid.cumsum(2)
        if self.normalize and extent is not None:
            y_embed = y_embed / extent[:, 0, None, None] * self.scale
            x_embed = x_embed / extent[:, 1, None, None] * self.scale
        elif self.normalize:
            eps = 1e-6
            y_embed = y_embed / (y_embed[:, -1:, :] + eps) * self.scale  # the last valid row is at ~2 pi
            x_embed = x_embed / (x_embed[:, :, -1:] + eps) * self.scale

        dim_t = torch.arange(self.num_pos_feats, dtype=torch.float32, device=device)
        dim_t = self.temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / self.num_pos_feats)

        pos_x = x_embed[..., None] / dim_t  # (B, H, W, num_pos_feats)
        pos_y = y_embed[..., None] / dim_t
        pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)  # (B, 2 * num_pos_feats, H, W)


def build_position_encoding(hidden_size: int) -> PositionEmbeddingSine:
    """DETR's default: sine, normalised, ``hidden_size / 2`` channels per axis."""
    if hidden_size % 2:
        raise ValueError(f"hidden_size {hidden_size} must be even for a 2-D sine encoding")
    return PositionEmbeddingSine(hidden_size // 2, normalize=True)
