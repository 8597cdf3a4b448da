"""The Hungarian matcher (Carion et al., 2020, Sec. 3.1, Eq. 1; DETR's ``models/matcher.py``).

DETR predicts a fixed-size set of N boxes per image; training needs a one-to-one assignment
between predictions and the (fewer) ground-truth objects. The matcher finds the assignment
of least total cost with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``),
the cost of pairing prediction i with object j being

    C[i, j] = -w_class * p_i(c_j) + w_bbox * ||b_i - b_j||_1 - w_giou * GIoU(b_i, b_j)

with p_i the softmax over prediction i's classes (the probability, not its log, as in the
paper), boxes normalised (cx, cy, w, h) for L1 and converted to (x0, y0, x1, y1) for GIoU,
and DETR's weights 1, 5, 2. Unmatched predictions are trained towards "no object".

With the sigmoid focal class_loss (Deformable DETR, Zhu et al. 2021; its
``HungarianMatcher``) the class term is the focal loss of calling the prediction the target's
class minus that of not calling it, on the sigmoid probabilities p = sigmoid(logit):

    C_class[i, j] = alpha (1 - p)^gamma (-log p) - (1 - alpha) p^gamma (-log(1 - p)),  p = p_i(c_j)

with alpha 0.25, gamma 2 and the class weight 2 (``CLASS_COSTS`` holds both forms).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from models.box_ops import box_cxcywh_to_xyxy, generalized_box_iou

FOCAL_ALPHA, FOCAL_GAMMA = 0.25, 2.0  # Lin et al. 2017, Sec. 5.1; Deformable DETR's values


def softmax_class_cost(logits: torch.Tensor, target_labels: torch.Tensor) -> torch.Tensor:
    """DETR's class cost: -p_i(c_j), p the softmax over classes and "no object".

    Args: logits (P, num_classes + 1), target_labels int64 (M,). Returns (P, M).
    """
    return -logits.softmax(-1)[:, target_labels]


def focal_class_cost(logits: torch.Tensor, target_labels: torch.Tensor) -> torch.Tensor:
    """Deformable DETR's class cost: focal loss of the positive minus that of the negative.

    Args: logits (P, num_classes) sigmoid logits, target_labels int64 (M,). Returns (P, M).
    """
    p = logits.sigmoid()[:, target_labels]  # (P, M)
    positive = FOCAL_ALPHA * (1 - p) ** FOCAL_GAMMA * -(p + 1e-8).log()
    negative = (1 - FOCAL_ALPHA) * p**FOCAL_GAMMA * -(1 - p + 1e-8).log()
    return positive - negative


CLASS_COSTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "softmax": softmax_class_cost,
    "focal": focal_class_cost,
}


class HungarianMatcher(nn.Module):
    """One-to-one matching of predictions to targets, per image.

    Args:
        cost_class: weight of the class term.
        cost_bbox: weight of the L1 box distance.
        cost_giou: weight of the generalised-IoU term.
        class_cost: the class term's form, a key of ``CLASS_COSTS``.
    """

    def __init__(
        self, cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, class_cost: str = "softmax"
    ) -> None:
        super().__init__()
        if cost_class == cost_bbox == cost_giou == 0:
            raise ValueError("at least one matching cost must be non-zero")
        if class_cost not in CLASS_COSTS:
            raise ValueError(f"unknown class cost {class_cost!r}; known: {sorted(CLASS_COSTS)}")
        self.class_cost = CLASS_COSTS[class_cost]
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou

    @torch.no_grad()
    def forward(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Match each image's predictions to its targets.

        Args:
            outputs: ``pred_logits`` (B, N, num_classes + 1), or (B, N, num_classes) for the
                focal cost, and ``pred_boxes`` (B, N, 4) normalised cxcywh.
            targets: one dict per image: ``labels`` int64 (M_b,) and ``boxes`` (M_b, 4)
                normalised cxcywh.

        Returns:
            Per image, ``(prediction_indices, target_indices)``, two int64 tensors of length
            min(N, M_b): prediction ``prediction_indices[k]`` is matched to target
            ``target_indices[k]``.
        """
        B, N = outputs["pred_logits"].shape[:2]
        logits = outputs["pred_logits"].flatten(0, 1)  # (B N, classes)
        pred_boxes = outputs["pred_boxes"].flatten(0, 1)  # (B N, 4)
        target_labels = torch.cat([t["labels"] for t in targets])  # (sum M,)
        target_boxes = torch.cat([t["boxes"] for t in targets])  # (sum M, 4)

        # Every prediction against every target of the batch, then cut per image.
        cost = (
            self.cost_class * self.class_cost(logits, target_labels)
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


def build_matcher(
    cost_class: float = 1.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, class_cost: str = "softmax"
) -> HungarianMatcher:
    """DETR's matcher with its default weights (1, 5, 2); Deformable DETR's is (2, 5, 2, "focal")."""
    return HungarianMatcher(cost_class, cost_bbox, cost_giou, class_cost)
