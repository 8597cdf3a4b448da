"""DETR's set prediction loss (Carion et al., 2020, Sec. 3.1, Eq. 2; DETR's ``SetCriterion``).

After the Hungarian matcher pairs predictions with targets:

* class loss: cross-entropy over every prediction, matched ones towards their target's class
  and all others towards "no object" (the last class), whose weight is ``eos_coef`` = 0.1 to
  offset the imbalance (most of the N queries predict nothing);
* box losses on the matched pairs only: L1 on normalised (cx, cy, w, h) and 1 - GIoU, both
  summed and divided by the number of target boxes in the batch;
* the total is ``1 * CE + 5 * L1 + 2 * GIoU``, and the same losses are added for every
  intermediate decoder layer (the auxiliary decoding losses, Sec. 3.2), each matched afresh.

The class loss's form is one entry of ``CLASSIFICATIONS``: ``"softmax"`` (DETR, above) or
``"focal"`` (Deformable DETR, Zhu et al. 2021, Sec. 4.1 / appendix A.2: a sigmoid per class
and no "no object" class, the sigmoid focal loss of Lin et al. 2017, Eq. 5, with alpha 0.25 and
gamma 2 over every query and class, summed and divided by the number of target boxes, weight 2,
matched with the focal cost of weight 2). It also names the post-processing the trained model
needs (``postprocess``: softmax without "no object", or per-class sigmoids).

With ``num_groups = K`` (Group DETR, Chen et al. 2023, Sec. 3.2) the predictions are K groups
of queries; each group is matched one-to-one on its own and its losses computed as above, and
the groups' losses are averaged (Group DETR's code divides by K times the number of boxes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from models.box_ops import box_cxcywh_to_xyxy, generalized_box_iou
from models.matcher import FOCAL_ALPHA, FOCAL_GAMMA, HungarianMatcher

WEIGHTS = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}


@dataclass(frozen=True)
class Classification:
    """One form of the class loss, and what goes with it.

    Attributes:
        head: :class:`models.detr.DETRConfig`'s ``class_head`` (the class head's outputs).
        class_cost: the matcher's class term (:data:`models.matcher.CLASS_COSTS`).
        cost_class: the matcher's class weight.
        loss: the class loss's name in the losses and ``weights``.
        weight: its weight in the total.
        postprocess: what the served post-processing must be: ``"softmax"`` (over the classes
            and "no object", which is dropped) or ``"sigmoid"`` (one sigmoid per class).
    """

    head: str
    class_cost: str
    cost_class: float
    loss: str
    weight: float
    postprocess: str


CLASSIFICATIONS: dict[str, Classification] = {
    "softmax": Classification("softmax", "softmax", 1.0, "loss_ce", 1.0, "softmax"),
    "focal": Classification("sigmoid", "focal", 2.0, "loss_focal", 2.0, "sigmoid"),
}


def sigmoid_focal_loss(
    logits: torch.Tensor, targets: torch.Tensor, alpha: float = FOCAL_ALPHA, gamma: float = FOCAL_GAMMA
) -> torch.Tensor:
    """The focal loss of every logit, summed (Lin et al. 2017, Eq. 5, with the alpha balance).

    ``FL = -alpha_t (1 - p_t)^gamma log(p_t)``, p = sigmoid(logit), p_t = p on a positive and
    1 - p on a negative, alpha_t = alpha on a positive and 1 - alpha on a negative.

    Args:
        logits: float (..., C) raw scores.
        targets: float (..., C), 1 on each positive and 0 elsewhere.

    Returns:
        The sum over all elements, a scalar.
    """
    p = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")  # -log(p_t)
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * (1 - p_t) ** gamma * ce).sum()


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
        class_loss: a key of ``CLASSIFICATIONS``.
        num_groups: Group DETR's query groups in the outputs (training outputs: K * N queries).
    """

    empty_weight: torch.Tensor  # a buffer, registered in __init__

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        eos_coef: float = 0.1,
        weights: dict[str, float] | None = None,
        class_loss: str = "softmax",
        num_groups: int = 1,
    ) -> None:
        super().__init__()
        if class_loss not in CLASSIFICATIONS:
            raise ValueError(f"unknown class_loss {class_loss!r}; known: {sorted(CLASSIFICATIONS)}")
        self.num_classes = num_classes
        self.matcher = matcher
        self.class_loss = CLASSIFICATIONS[class_loss]
        self.num_groups = num_groups
        self.weights = dict(weights or WEIGHTS)
        if self.class_loss.loss != "loss_ce":
            self.weights.pop("loss_ce", None)
            self.weights.setdefault(self.class_loss.loss, self.class_loss.weight)
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

    def loss_labels_focal(
        self, outputs: dict[str, torch.Tensor], targets: list[dict[str, torch.Tensor]], indices: list, num_boxes: float
    ) -> dict[str, torch.Tensor]:
        """Sigmoid focal loss over all B x N x num_classes logits, divided by ``num_boxes``.

        A matched query's target is one-hot on its object's class; every other query's is all
        zeros (there is no "no object" class).
        """
        logits = outputs["pred_logits"]  # (B, N, num_classes)
        onehot = torch.zeros_like(logits)
        batch, pred = _matched_indices(indices)
        labels = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices, strict=True)])
        onehot[batch, pred, labels] = 1.0
        return {"loss_focal": sigmoid_focal_loss(logits, onehot) / num_boxes}

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
        if self.class_loss.postprocess == "sigmoid":  # a query counts when a class passes 0.5
            predicted = (outputs["pred_logits"].max(-1).values > 0).sum(1).float()  # (B,)
        else:
            predicted = (outputs["pred_logits"].argmax(-1) != self.num_classes).sum(1).float()  # (B,)
        true = torch.as_tensor([len(t["labels"]) for t in targets], dtype=torch.float32, device=predicted.device)
        return (predicted - true).abs().mean()

    def denoising_losses(
        self, layer: dict[str, torch.Tensor], dn: dict[str, torch.Tensor], num_boxes: float
    ) -> dict[str, torch.Tensor]:
        """DN-DETR's reconstruction losses of one decoder layer's denoising outputs (Li et al. 2022, Sec. 3.1).

        Every valid denoising query is paired with the object it was noised from: the class loss
        towards that object's class (cross-entropy averaged over those queries, or the focal loss
        over every denoising query and class / boxes), L1 and 1 - GIoU of the boxes, summed and
        divided by the number of boxes times the denoising groups.
        """
        valid = dn["valid"]  # (B, P M)
        groups = valid.shape[1] // int(dn["group_size"])
        norm = num_boxes * groups
        labels, target = dn["target_labels"][valid], dn["target_boxes"][valid]  # (V,), (V, 4)
        pred = layer["pred_boxes"][valid]  # (V, 4)
        if self.class_loss.loss == "loss_focal":
            logits = layer["pred_logits"][valid]  # (V, num_classes)
            onehot = torch.zeros_like(logits)
            onehot[torch.arange(len(labels), device=labels.device), labels] = 1.0
            class_loss = {"loss_focal": sigmoid_focal_loss(logits, onehot) / norm}
        else:
            class_loss = {"loss_ce": F.cross_entropy(layer["pred_logits"][valid], labels)}
        giou = torch.diag(generalized_box_iou(box_cxcywh_to_xyxy(pred), box_cxcywh_to_xyxy(target)))
        return {
            **class_loss,
            "loss_bbox": F.l1_loss(pred, target, reduction="none").sum() / norm,
            "loss_giou": (1 - giou).sum() / norm,
        }

    def _losses(
        self, outputs: dict[str, Any], targets: list[dict[str, torch.Tensor]], num_boxes: float
    ) -> dict[str, torch.Tensor]:
        """The losses of one decoder layer's outputs, each group matched alone, averaged over groups."""
        groups = []
        for logits, boxes in zip(
            outputs["pred_logits"].chunk(self.num_groups, 1),
            outputs["pred_boxes"].chunk(self.num_groups, 1),
            strict=True,
        ):
            group = {"pred_logits": logits, "pred_boxes": boxes}
            indices = self.matcher(group, targets)
            if self.class_loss.loss == "loss_focal":
                labels = self.loss_labels_focal(group, targets, indices, num_boxes)
            else:
                labels = self.loss_labels(group, targets, indices)
            groups.append({**labels, **self.loss_boxes(group, targets, indices, num_boxes)})
        if len(groups) == 1:
            return groups[0]
        return {name: torch.stack([g[name] for g in groups]).mean() for name in groups[0]}

    def forward(self, outputs: dict[str, Any], targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Every loss, by name; auxiliary ones end in ``_<layer>`` (``loss_ce_0``, ...).

        Args:
            outputs: :class:`models.detr.DETR`'s output dict (``aux_outputs`` optional); with
                ``num_groups`` K, training-mode outputs of K * N queries, group k at
                ``[k N, (k + 1) N)``.
            targets: one dict per image: ``labels`` int64 (M_b,), ``boxes`` (M_b, 4)
                normalised cxcywh.

        Returns:
            The losses, ``loss`` (the weighted total to minimise) and ``cardinality_error``
            (of group 0, the one inference keeps).
        """
        num_boxes = max(float(sum(len(t["labels"]) for t in targets)), 1.0)
        losses = self._losses(outputs, targets, num_boxes)
        # sum() of tensors is a tensor (its int start only for no terms; there is always one)
        total = cast(torch.Tensor, sum(self.weights[k] * v for k, v in losses.items()))
        for i, aux in enumerate(outputs.get("aux_outputs", [])):
            aux_losses = self._losses(aux, targets, num_boxes)
            total = total + sum(self.weights[k] * v for k, v in aux_losses.items())
            losses.update({f"{k}_{i}": v for k, v in aux_losses.items()})
        if "dn" in outputs:  # DN-DETR: reconstruct each noised object, no matching
            dn = outputs["dn"]
            layers = [(dn, ""), *((aux, f"_{i}") for i, aux in enumerate(dn.get("aux_outputs", [])))]
            for layer, suffix in layers:
                dn_losses = self.denoising_losses(layer, dn, num_boxes)
                total = total + sum(self.weights[k] * v for k, v in dn_losses.items())
                losses.update({f"{k}_dn{suffix}": v for k, v in dn_losses.items()})
        losses["loss"] = total
        group_0 = {k: outputs[k].chunk(self.num_groups, 1)[0] for k in ("pred_logits", "pred_boxes")}
        losses["cardinality_error"] = self.cardinality_error(group_0, targets)  # what inference would count
        return losses


def build_criterion(
    num_classes: int, eos_coef: float = 0.1, class_loss: str = "softmax", num_groups: int = 1
) -> SetCriterion:
    """DETR's criterion: matcher costs (1, 5, 2), loss weights (1, 5, 2), no-object weight 0.1.

    ``class_loss="focal"``: Deformable DETR's, class cost and weight 2 in focal form.
    """
    from models.matcher import build_matcher

    if class_loss not in CLASSIFICATIONS:
        raise ValueError(f"unknown class_loss {class_loss!r}; known: {sorted(CLASSIFICATIONS)}")
    form = CLASSIFICATIONS[class_loss]
    matcher = build_matcher(cost_class=form.cost_class, class_cost=form.class_cost)
    return SetCriterion(num_classes, matcher, eos_coef, class_loss=class_loss, num_groups=num_groups)
