"""Batched data augmentation on tensors (any device): the DeiT-style recipe's pieces.

Everything here works on a whole batch at once, with the randomness drawn from a CPU
``torch.Generator`` so that a run is reproducible and runs the same on a CPU and a GPU.

* :func:`random_crop_flip` — pad by ``padding`` pixels (reflect) and crop back at a random
  offset, then flip left-right with probability 1/2 (the standard CIFAR augmentation,
  He et al. 2016, Section 4.2).
* :func:`mix` — Mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019) between each image and
  the batch reversed, as timm's ``Mixup`` does in "batch" mode, returning soft targets.
* :func:`random_erase` — Random Erasing (Zhong et al. 2020, Alg. 1) with per-pixel normal
  noise, timm's ``RandomErasing(mode="pixel")`` that DeiT trains with (probability 0.25).
* :func:`soft_targets` and :func:`soft_cross_entropy` — label smoothing (Szegedy et al. 2016)
  and the cross-entropy against a target distribution.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F


def random_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop with reflect padding, then a random horizontal flip, per image.

    Args:
        images: float (B, C, H, W).
        generator: CPU generator for the offsets and flips.
        padding: pixels of reflect padding on each side (0: flip only).

    Returns:
        float (B, C, H, W), a new tensor.
    """
    B, _, H, W = images.shape
    device = images.device
    flip = (torch.rand(B, generator=generator) < 0.5).to(device)
    if padding > 0:
        padded = F.pad(images, (padding,) * 4, mode="reflect")  # (B, C, H + 2p, W + 2p)
        dy = torch.randint(0, 2 * padding + 1, (B,), generator=generator).to(device)
        dx = torch.randint(0, 2 * padding + 1, (B,), generator=generator).to(device)
        rows = (dy[:, None] + torch.arange(H, device=device))[:, :, None]  # (B, H, 1)
        cols = (dx[:, None] + torch.arange(W, device=device))[:, None, :]  # (B, 1, W)
        batch = torch.arange(B, device=device)[:, None, None]
        images = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (B, C, H, W)
    return torch.where(flip[:, None, None, None], images.flip(3), images)


def random_erase(
    images: torch.Tensor,
    generator: torch.Generator,
    prob: float = 0.25,
    area: tuple[float, float] = (0.02, 1 / 3),
    aspect: tuple[float, float] = (0.3, 1 / 0.3),
) -> torch.Tensor:
    """Random Erasing (Zhong et al. 2020, Alg. 1): with probability ``prob`` per image, a
    rectangle of ``area`` (fraction of the image) and ``aspect`` ratio (h / w, drawn
    log-uniformly) at a uniform position is replaced by N(0, 1) noise (the images are
    normalised, so that is noise of the data's own scale). Up to 10 draws per image find a
    rectangle that fits; an image whose draws all miss is left as it is.

    Args:
        images: float (B, C, H, W), normalised.
        generator: CPU generator for every draw.

    Returns:
        float (B, C, H, W), a new tensor.
    """
    B, C, H, W = images.shape
    out = images.clone()
    erase = torch.rand(B, generator=generator) < prob
    log_aspect = (float(np.log(aspect[0])), float(np.log(aspect[1])))
    for b in torch.nonzero(erase).flatten().tolist():
        for _ in range(10):
            u, v = torch.rand(2, generator=generator).tolist()
            target = H * W * (area[0] + (area[1] - area[0]) * u)
            ratio = float(np.exp(log_aspect[0] + (log_aspect[1] - log_aspect[0]) * v))
            h, w = round((target * ratio) ** 0.5), round((target / ratio) ** 0.5)
            if 0 < h < H and 0 < w < W:
                top = int(torch.randint(0, H - h + 1, (1,), generator=generator))
                left = int(torch.randint(0, W - w + 1, (1,), generator=generator))
                noise = torch.randn(C, h, w, generator=generator).to(images.device, images.dtype)
                out[b, :, top : top + h, left : left + w] = noise
                break
    return out


def soft_targets(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """One-hot targets with label smoothing: (1 - s) on the class plus s / K everywhere.

    Args:
        labels: int64 (B,).

    Returns:
        float32 (B, num_classes), rows summing to 1.
    """
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return targets.scatter_(1, labels[:, None], 1.0 - smoothing + off)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -sum(target * log_softmax(logits)); logits, targets (B, K)."""
    return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


def cutmix_box(height: int, width: int, lam: float, generator: torch.Generator) -> tuple[int, int, int, int]:
    """A CutMix box (Yun et al. 2019, Eq. 2) of area ~ (1 - lam) at a uniform random centre, clipped.

    Returns:
        (y0, y1, x0, x1) in pixels, half-open.
    """
    cut = (1.0 - lam) ** 0.5
    ch, cw = int(height * cut), int(width * cut)
    cy = int(torch.randint(0, height, (1,), generator=generator))
    cx = int(torch.randint(0, width, (1,), generator=generator))
    y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, height)
    x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, width)
    return y0, y1, x0, x1


def mix(
    images: torch.Tensor,
    targets: torch.Tensor,
    generator: torch.Generator,
    *,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup or CutMix of each image with the batch reversed (one lam per batch, as timm's "batch" mode).

    With both alphas > 0 each batch gets one of the two, chosen with equal chance; with
    probability ``1 - prob`` (or both alphas 0) the batch is returned unchanged.

    Args:
        images: float (B, C, H, W).
        targets: float (B, K) soft targets (e.g. from :func:`soft_targets`).
        generator: CPU generator.
        mixup_alpha, cutmix_alpha: Beta(alpha, alpha) parameters; 0 disables that method.
        prob: probability that a batch is mixed at all.

    Returns:
        (images, targets) mixed; targets weighted by the true mixed area for CutMix.
    """
    methods = [m for m, a in (("mixup", mixup_alpha), ("cutmix", cutmix_alpha)) if a > 0]
    if not methods or float(torch.rand(1, generator=generator)) >= prob:
        return images, targets
    method = methods[int(torch.randint(0, len(methods), (1,), generator=generator))]
    alpha = mixup_alpha if method == "mixup" else cutmix_alpha
    lam = _beta(alpha, generator)
    other = images.flip(0)
    if method == "mixup":
        images = lam * images + (1 - lam) * other
    else:
        H, W = images.shape[2:]
        y0, y1, x0, x1 = cutmix_box(H, W, lam, generator)
        images = images.clone()
        images[:, :, y0:y1, x0:x1] = other[:, :, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (H * W)
    return images, lam * targets + (1 - lam) * targets.flip(0)


def _beta(alpha: float, generator: torch.Generator) -> float:
    """A Beta(alpha, alpha) sample, reproducible from ``generator`` (torch's Beta sampler takes none)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    return float(np.random.default_rng(seed).beta(alpha, alpha))
