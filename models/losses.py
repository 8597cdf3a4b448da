"""DETR's set prediction loss (Carion et al., 2020, Sec. 3.1, Eq. 2; DETR's ``SetCriterion``).

After the Hungarian matcher pairs predictions with targets:

* class loss: cross-entropy over every prediction, matched ones towards their target's class
  and all others towards "no object" (the last class), whose weight is ``eos_coef`` = 0.1 to
  offset the imbalance (most of the N queries predict nothing);
* box losses on the matched pairs only: L1 on normalised (cx, cy, w, h) and 1 - GIoU, both
  summed and divided by the number of target boxes in the batch;
* the total is ``1 * CE + 5 * L1 + 2 * GIoU``, and the same losses are added for every
  intermediate decoder layer (the auxiliary decoding losses, Sec. 3.2), each matched afresh.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from models.box_ops import box_cxcywh_to_xyxy, generalized_box_iou
from models.matcher import HungarianMatcher

WEIGHTS = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}


def _matched_indices(indices: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch index, prediction index) of every matched prediction, two int64 (sum M,) tensors."""
    batch = torch.cat([torch.full_like(pred, i) for i, (pred, _) in enumerate(indices)])
    pred = torch.cat([pred for pred, _ in indices])
    return batch, pred


class SetCriterion(nn.Module):
    """The Hungarian loss with auxiliary decoding losses.

    Args:
        num_classes: object classes, without "no object" (class id ``num_classes``).
        matcher: the prediction-target matcher.
        eos_coef: the cross-entropy weight of the "no object" class (0.1 in the paper).
        weights: weight of each loss in the total (DETR's 1, 5, 2).
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        eos_coef: float = 0.1,
        weights: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher
        self.weights = dict(weights or WEIGHTS)
        empty_weight = torch.ones(num_classes + 1)
        empty_weight[-1] = eos_coef
        self.register_buffer("empty_weight", empty_weight)

    def loss_labels(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]], indices: list
    ) -> dict[str, torch.Tensor]:
        """Weighted cross-entropy over all B x N predictions (a weighted mean, as ``F.cross_entropy``)."""
        logits = outputs["pred_logits"]  # (B, N, num_classes + 1)
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[_matched_indices(indices)] = torch.cat(
            [t["labels"][j] for t, (_, j) in zip(targets, indices, strict=True)]
        )
        loss = F.cross_entropy(logits.transpose(1, 2), target_classes, self.empty_weight)
        return {"loss_ce": loss}

    def loss_boxes(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]], indices: list, num_boxes: float
    ) -> dict[str, torch.Tensor]:
        """L1 and 1 - GIoU of the matched boxes, each summed and divided by ``num_boxes``."""
        pred = outputs["pred_boxes"][_matched_indices(indices)]  # (sum M, 4)
        target = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices, strict=True)])  # (sum M, 4)
        loss_bbox = F.l1_loss(pred, target, reduction="none").sum() / num_boxes
        giou = torch.diag(generalized_box_iou(box_cxcywh_to_xyxy(pred), box_cxcywh_to_xyxy(target)))
        loss_giou = (1 - giou).sum() / num_boxes
        return {"loss_bbox": loss_bbox, "loss_giou": loss_giou}

    @torch.no_grad()
    def cardinality_error(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]]
    ) -> torch.Tensor:
        """Mean |predicted - true object count| per image, predicted = argmax not "no object" (logged only)."""
        predicted = (outputs["pred_logits"].argmax(-1) != self.num_classes).sum(1).float()  # (B,)
        true = torch.as_tensor([len(t["labels"]) for t in targets], dtype=torch.float32, device=predicted.device)
        return (predicted - true).abs().mean()

    def _losses(
        self, outputs: dict[str, Any], targets: list[dict[str, torch.Tensor]], num_boxes: float
    ) -> dict[str, torch.Tensor]:
        indices = self.matcher(outputs, targets)
        return {**self.loss_labels(outputs, targets, indices), **self.loss_boxes(outputs, targets, indices, num_boxes)}

    def forward(self, outputs: dict[str, Any], targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Every loss, by name; auxiliary ones end in ``_<layer>`` (``loss_ce_0``, ...).

        Args:
            outputs: :class:`models.detr.DETR`'s output dict (``aux_outputs`` optional).
            targets: one dict per image: ``labels`` int64 (M_b,), ``boxes`` (M_b, 4)
                normalised cxcywh.

        Returns:
            The losses, ``loss`` (the weighted total to minimise) and ``cardinality_error``.
        """
        num_boxes = max(float(sum(len(t["labels"]) for t in targets)), 1.0)
        losses = self._losses(outputs, targets, num_boxes)
        total = sum(self.weights[k] * v for k, v in losses.items())
        for i, aux in enumerate(outputs.get("aux_outputs", [])):
            aux_losses = self._losses(aux, targets, num_boxes)
            total = total + sum(self.weights[k] * v for k, v in aux_losses.items())
            losses.update({f"{k}_{i}": v for k, v in aux_losses.items()})
        losses["loss"] = total
        losses["cardinality_error"] = self.cardinality_error(outputs, targets)
        return losses


def build_criterion(num_classes: int, eos_coef: float = 0.1) -> SetCriterion:
    """DETR's criterion: matcher costs (1, 5, 2), loss weights (1, 5, 2), no-object weight 0.1."""
    from models.matcher import build_matcher

    return SetCriterion(num_classes, build_matcher(), eos_coef=eos_coef)
