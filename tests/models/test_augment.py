"""The batched augmentations: crops are crops, flips are flips, mixed targets match the mixed pixels."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from models.augment import cutmix_box, mix, random_crop_flip, soft_cross_entropy, soft_targets


def test_without_padding_each_image_is_itself_or_its_mirror() -> None:
    images = torch.randn(64, 3, 8, 8)
    out = random_crop_flip(images, torch.Generator().manual_seed(0), padding=0)
    same = (out == images).flatten(1).all(1)
    mirrored = (out == images.flip(3)).flatten(1).all(1)
    assert bool((same | mirrored).all())
    assert 10 < int(mirrored.sum()) < 54  # about half flipped


def test_crops_are_windows_of_the_reflect_padded_image() -> None:
    images = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6)
    out = random_crop_flip(images, torch.Generator().manual_seed(3), padding=2)
    padded = F.pad(images, (2, 2, 2, 2), mode="reflect")
    for n in range(2):
        windows = [padded[n, :, y : y + 6, x : x + 6] for y in range(5) for x in range(5)]
        candidates = windows + [w.flip(2) for w in windows]
        assert any(torch.equal(out[n], c) for c in candidates)


def test_soft_targets_smooth_the_labels() -> None:
    targets = soft_targets(torch.tensor([2, 0]), num_classes=4, smoothing=0.1)
    assert torch.allclose(targets[0], torch.tensor([0.025, 0.025, 0.925, 0.025]))
    assert torch.allclose(targets.sum(1), torch.ones(2))
    logits = torch.randn(2, 4)
    # With hard targets the soft cross-entropy is the ordinary one.
    hard = soft_targets(torch.tensor([2, 0]), 4, 0.0)
    assert soft_cross_entropy(logits, hard).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([2, 0])).item()
    )


def test_cutmix_targets_weigh_the_pasted_area() -> None:
    images = torch.zeros(2, 1, 10, 10)
    images[1] = 1.0  # image 0 black, image 1 white; each is mixed with the other
    targets = soft_targets(torch.tensor([0, 1]), 2)
    out, mixed = mix(images, targets, torch.Generator().manual_seed(1), cutmix_alpha=1.0)
    white_in_0 = float(out[0].mean())  # the share of image 0 now taken from image 1
    assert 0.0 < white_in_0 < 1.0
    assert mixed[0].tolist() == pytest.approx([1 - white_in_0, white_in_0])
    assert mixed[1].tolist() == pytest.approx([white_in_0, 1 - white_in_0])


def test_mixup_blends_pixels_and_targets_with_one_lambda() -> None:
    images = torch.stack([torch.zeros(1, 4, 4), torch.ones(1, 4, 4)])
    targets = soft_targets(torch.tensor([0, 1]), 2)
    out, mixed = mix(images, targets, torch.Generator().manual_seed(2), mixup_alpha=0.8)
    lam = 1.0 - float(out[0, 0, 0, 0])
    assert torch.allclose(out[0], torch.full((1, 4, 4), 1 - lam))
    assert mixed[0].tolist() == pytest.approx([lam, 1 - lam])


def test_no_mixing_when_off() -> None:
    images, targets = torch.randn(4, 3, 8, 8), soft_targets(torch.tensor([0, 1, 2, 3]), 4)
    out, mixed = mix(images, targets, torch.Generator().manual_seed(0))
    assert out is images and mixed is targets


def test_cutmix_box_has_about_the_asked_area_when_centred() -> None:
    gen = torch.Generator().manual_seed(0)
    boxes = [cutmix_box(100, 100, 0.75, gen) for _ in range(200)]
    areas = [(y1 - y0) * (x1 - x0) for y0, y1, x0, x1 in boxes]
    assert max(areas) == 50 * 50  # sqrt(1 - 0.75) = 0.5 of each side when not clipped
    assert all(0 <= y0 <= y1 <= 100 and 0 <= x0 <= x1 <= 100 for y0, y1, x0, x1 in boxes)


def test_random_erase_replaces_one_rectangle_per_chosen_image_reproducibly() -> None:
    from models.augment import random_erase

    images = torch.zeros(64, 3, 32, 32)
    assert torch.equal(random_erase(images, torch.Generator().manual_seed(0), prob=0.0), images)
    first = random_erase(images, torch.Generator().manual_seed(1), prob=1.0)
    again = random_erase(images, torch.Generator().manual_seed(1), prob=1.0)
    assert torch.equal(first, again)
    assert torch.equal(images, torch.zeros_like(images))  # the input is left alone
    erased = (first != 0).any(dim=1)  # (B, H, W): where noise went
    areas = erased.flatten(1).sum(1).float() / (32 * 32)
    assert (areas > 0).float().mean() > 0.9  # nearly every image found a rectangle within 10 draws
    for mask, area in zip(erased, areas, strict=True):
        if area == 0:
            continue
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert int(mask.sum()) == int(box)  # one filled rectangle
        assert 0.015 <= float(area) <= 0.36  # of the asked area range, up to rounding
