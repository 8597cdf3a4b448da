"""DN-DETR's denoising queries (Li et al., "DN-DETR: Accelerate DETR Training by Introducing Query
DeNoising", CVPR 2022, Sec. 3), for training only.

Besides its N matching queries, the decoder gets ``groups`` copies of every image's ground truth
with noise added: each box's centre shifted by up to ``box_noise`` of half its width and height
and its width and height scaled by a factor in [1 - ``box_noise``, 1 + ``box_noise``] (Sec. 3.2,
lambda_1 = lambda_2 = 0.4), each label flipped to a random class with probability
``label_noise`` (Sec. 3.4, 0.2). A denoising query's content is its (noised) label's embedding
and its position an MLP of its (noised) box, and it is trained to reconstruct the original
object with the same class and box losses, without matching (Sec. 3.1). The attention mask of
Sec. 3.3 keeps the matching queries from seeing any denoising query (they would read the
answer) and each denoising group from seeing another; denoising queries see the matching ones.
Images with fewer objects than the batch's most are padded with slots whose loss is not counted.

This module adapts DN-DETR, built on DAB-DETR's anchor-box queries, to DETR's learned queries:
only the denoising queries take their position from a box. Nothing here runs at inference.
"""

from __future__ import annotations

import torch

from models.box_ops import box_cxcywh_to_xyxy, box_xyxy_to_cxcywh


def noised_queries(
    targets: list[dict[str, torch.Tensor]],
    groups: int,
    num_classes: int,
    *,
    label_noise: float = 0.2,
    box_noise: float = 0.4,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """The denoising queries of a batch: ``groups`` noised copies of each image's objects.

    Args:
        targets: per image, ``labels`` int64 (M_b,) and ``boxes`` (M_b, 4) normalised cxcywh.
        groups: denoising groups P.
        num_classes: object classes; padding slots get label ``num_classes``.

    Returns:
        ``labels`` int64 (B, P * M) and ``boxes`` float32 (B, P * M, 4) normalised cxcywh, the
        noised queries, M = the most objects of an image in the batch (at least 1), group p at
        ``[p M, (p + 1) M)``; ``target_labels`` and ``target_boxes``, the originals; ``valid``
        bool (B, P * M), False on padding slots; ``group_size`` M as a 0-d int64 tensor. On the
        targets' device; the noise is drawn on the CPU (``generator`` is a CPU one), so a run draws
        the same noise on a CPU and a GPU.
    """
    batch = len(targets)
    size = max([1, *(len(t["labels"]) for t in targets)])
    labels = torch.full((batch, size), num_classes, dtype=torch.int64)
    boxes = torch.tensor([0.5, 0.5, 0.1, 0.1]).repeat(batch, size, 1)
    valid = torch.zeros(batch, size, dtype=torch.bool)
    for b, target in enumerate(targets):
        m = len(target["labels"])
        labels[b, :m], boxes[b, :m], valid[b, :m] = target["labels"].cpu(), target["boxes"].cpu(), True
    labels, boxes, valid = labels.repeat(1, groups), boxes.repeat(1, groups, 1), valid.repeat(1, groups)

    flip = (torch.rand(labels.shape, generator=generator) < label_noise) & valid
    noisy_labels = torch.where(flip, torch.randint(0, num_classes, labels.shape, generator=generator), labels)
    uniform = torch.rand(boxes.shape, generator=generator) * 2 - 1  # (B, P M, 4) in [-1, 1)
    cx, cy, w, h = boxes.unbind(-1)
    centre_shift = uniform[..., :2] * box_noise * boxes[..., 2:] / 2
    noisy = torch.stack(
        [
            cx + centre_shift[..., 0],
            cy + centre_shift[..., 1],
            w * (1 + uniform[..., 2] * box_noise),
            h * (1 + uniform[..., 3] * box_noise),
        ],
        dim=-1,
    )
    noisy = box_xyxy_to_cxcywh(box_cxcywh_to_xyxy(noisy).clamp(0, 1))  # inside the image, as DN-DETR clips
    device = targets[0]["boxes"].device if targets else torch.device("cpu")
    return {
        "labels": noisy_labels.to(device),
        "boxes": noisy.to(device),
        "target_labels": labels.to(device),
        "target_boxes": boxes.to(device),
        "valid": valid.to(device),
        "group_size": torch.tensor(size),
    }


def attention_mask(matching: torch.Tensor, groups: int, group_size: int) -> torch.Tensor:
    """The decoder self-attention mask with denoising queries appended (DN-DETR, Sec. 3.3).

    Args:
        matching: bool (Q, Q), True where matching query i may attend to matching query j.
        groups, group_size: P denoising groups of M queries each, after the Q matching ones.

    Returns:
        bool (Q + P M, Q + P M), True where query i may attend to query j: the matching block
        as given, each denoising group to itself and to every matching query, nothing else.
    """
    q = matching.shape[0]
    total = q + groups * group_size
    mask = torch.zeros(total, total, dtype=torch.bool, device=matching.device)
    mask[:q, :q] = matching
    mask[q:, :q] = True
    for g in range(groups):
        start = q + g * group_size
        mask[start : start + group_size, start : start + group_size] = True
    return mask
