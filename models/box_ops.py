"""Box conversions and (generalised) IoU, as in DETR's ``util/box_ops.py``.

Boxes are float tensors with the coordinates in the last axis: ``cxcywh`` is (centre x, centre
y, width, height), ``xyxy`` is (xmin, ymin, xmax, ymax), in any consistent unit (DETR's
predictions are normalised to [0, 1] of the input).
"""

from __future__ import annotations

import torch


def box_cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) cxcywh -> (..., 4) xyxy."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)


def box_xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) xyxy -> (..., 4) cxcywh."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """(N, 4) xyxy -> (N,) areas."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise IoU and union of (N, 4) and (M, 4) xyxy boxes: two (N, M) tensors."""
    area1, area2 = box_area(boxes1), box_area(boxes2)
    top_left = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])  # (N, M, 2)
    bottom_right = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])  # (N, M, 2)
    wh = (bottom_right - top_left).clamp(min=0)  # (N, M, 2)
    inter = wh[..., 0] * wh[..., 1]  # (N, M)
    union = area1[:, None] + area2[None, :] - inter
    return inter / union, union


def generalized_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Pairwise generalised IoU of (N, 4) and (M, 4) xyxy boxes, (N, M) in [-1, 1].

    GIoU = IoU - (|C| - |A u B|) / |C|, C the smallest box enclosing A and B
    (Rezatofighi et al., CVPR 2019, Algorithm 1).

    Raises:
        ValueError: a box with xmax < xmin or ymax < ymin (it would give a wrong GIoU).
    """
    if not (boxes1[:, 2:] >= boxes1[:, :2]).all() or not (boxes2[:, 2:] >= boxes2[:, :2]).all():
        raise ValueError("generalized_box_iou needs xyxy boxes with xmax >= xmin and ymax >= ymin")
    iou, union = box_iou(boxes1, boxes2)
    top_left = torch.min(boxes1[:, None, :2], boxes2[None, :, :2])
    bottom_right = torch.max(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (bottom_right - top_left).clamp(min=0)  # (N, M, 2)
    enclosing = wh[..., 0] * wh[..., 1]
    return iou - (enclosing - union) / enclosing
