"""The Hungarian matcher (Carion et al., 2020, Sec. 3.1, Eq. 1; DETR's ``models/matcher.py``).

DETR predicts a fixed-size set of N boxes per image; training needs a one-to-one assignment
between predictions and the (fewer) ground-truth objects. The matcher finds the assignment
of least total cost with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``),
the cost of pairing prediction i with object j being

    C[i, j] = -w_class * p_i(c_j) + w_bbox * ||b_i - b_j||_1 - w_giou * GIoU(b_i, b_j)

with p_i the softmax over prediction i's classes (the probability, not its log, as in the
paper), boxes normalised (cx, cy, w, h) for L1 and converted to (x0, y0, x1, y1) for GIoU,
and DETR's weights 1, 5, 2. Unmatched predictions are trained towards "no object".
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from models.box_ops import box_cxcywh_to_xyxy, generalized_box_iou


class HungarianMatcher(nn.Module):
    """One-to-one matching of predictions to targets, per image.

    Args:
        cost_class: weight of the class-probability term.
        cost_bbox: weight of the L1 box distance.
        cost_giou: weight of the generalised-IoU term.
    """

    def __init__(self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0) -> None:
        super().__init__()
        if cost_class == cost_bbox == cost_giou == 0:
            raise ValueError("at least one matching cost must be non-zero")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    @torch.no_grad()
    def forward(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Match each image's predictions to its targets.

        Args:
            outputs: ``pred_logits`` (B, N, num_classes + 1) and ``pred_boxes`` (B, N, 4)
                normalised cxcywh.
            targets: one dict per image: ``labels`` int64 (M_b,) and ``boxes`` (M_b, 4)
                normalised cxcywh.

        Returns:
            Per image, ``(prediction_indices, target_indices)``, two int64 tensors of length
            min(N, M_b): prediction ``prediction_indices[k]`` is matched to target
            ``target_indices[k]``.
        """
        B, N = outputs["pred_logits"].shape[:2]
        probabilities = outputs["pred_logits"].flatten(0, 1).softmax(-1)  # (B N, num_classes + 1)
        pred_boxes = outputs["pred_boxes"].flatten(0, 1)  # (B N, 4)
        target_labels = torch.cat([t["labels"] for t in targets])  # (sum M,)
        target_boxes = torch.cat([t["boxes"] for t in targets])  # (sum M, 4)

        # Every prediction against every target of the batch, then cut per image.
        cost = (
            -self.cost_class * probabilities[:, target_labels]
            + self.cost_bbox * torch.cdist(pred_boxes, target_boxes, p=1)
            - self.cost_giou * generalized_box_iou(box_cxcywh_to_xyxy(pred_boxes), box_cxcywh_to_xyxy(target_boxes))
        )  # (B N, sum M)
        cost = cost.view(B, N, -1).cpu()

        sizes = [len(t["boxes"]) for t in targets]
        matches = []
        for b, block in enumerate(cost.split(sizes, dim=-1)):
            rows, cols = linear_sum_assignment(block[b].numpy())
            matches.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)))
        return matches


def build_matcher(cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0) -> HungarianMatcher:
    """DETR's matcher with its default weights (1, 5, 2)."""
    return HungarianMatcher(cost_class, cost_bbox, cost_giou)
