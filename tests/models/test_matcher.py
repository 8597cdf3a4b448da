"""Box ops and the Hungarian matcher on hand-built cases."""

from __future__ import annotations

import itertools

import pytest
import torch

from models.box_ops import box_cxcywh_to_xyxy, box_iou, box_xyxy_to_cxcywh, generalized_box_iou
from models.matcher import HungarianMatcher, build_matcher


def test_box_conversions_round_trip() -> None:
    xyxy = torch.tensor([[10.0, 20.0, 30.0, 60.0]])
    cxcywh = box_xyxy_to_cxcywh(xyxy)
    assert cxcywh.tolist() == [[20.0, 40.0, 20.0, 40.0]]
    assert box_cxcywh_to_xyxy(cxcywh).tolist() == xyxy.tolist()


def test_giou_of_known_boxes() -> None:
    unit = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    # Identical: IoU 1, the enclosing box adds nothing.
    assert generalized_box_iou(unit, unit).item() == pytest.approx(1.0)
    # Disjoint, side by side with a gap of 1: IoU 0, enclosing 3, union 2 -> -1/3.
    assert generalized_box_iou(unit, torch.tensor([[2.0, 0.0, 3.0, 1.0]])).item() == pytest.approx(-1 / 3)
    # Overlapping 2x2 squares offset by (1, 1): inter 1, union 7, enclosing 9 -> 1/7 - 2/9.
    a, b = torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]])
    assert box_iou(a, b)[0].item() == pytest.approx(1 / 7)
    assert generalized_box_iou(a, b).item() == pytest.approx(1 / 7 - 2 / 9)
    # One inside the other: GIoU = IoU = 1/4.
    assert generalized_box_iou(a, torch.tensor([[0.0, 0.0, 1.0, 1.0]])).item() == pytest.approx(0.25)
    # Far apart: tends to -1.
    assert generalized_box_iou(unit, torch.tensor([[99.0, 99.0, 100.0, 100.0]])).item() < -0.99


def test_giou_refuses_inverted_boxes() -> None:
    with pytest.raises(ValueError, match="xmax >= xmin"):
        generalized_box_iou(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), torch.tensor([[0.0, 0.0, 1.0, 1.0]]))


def _logits_for(classes: list[int], num_classes: int, confidence: float = 8.0) -> torch.Tensor:
    logits = torch.zeros(len(classes), num_classes + 1)
    logits[torch.arange(len(classes)), torch.tensor(classes)] = confidence
    return logits


def test_matcher_pairs_each_target_with_the_prediction_that_fits_it() -> None:
    # Three predictions; the two targets are predictions 2 and 0, in that order.
    boxes = torch.tensor([[0.2, 0.2, 0.1, 0.1], [0.5, 0.5, 0.2, 0.2], [0.8, 0.7, 0.1, 0.3]])
    outputs = {"pred_logits": _logits_for([3, 4, 1], num_classes=5)[None], "pred_boxes": boxes[None]}
    targets = [{"labels": torch.tensor([1, 3]), "boxes": boxes[[2, 0]]}]
    ((pred, tgt),) = build_matcher()(outputs, targets)
    assert dict(zip(tgt.tolist(), pred.tolist(), strict=True)) == {0: 2, 1: 0}


def test_matcher_is_optimal_not_greedy() -> None:
    # Costs (L1 only): greedy would give target 0 its nearest prediction 0 (cost 0.1) and
    # leave target 1 with prediction 1 (cost 0.9); the optimum swaps them (0.2 + 0.2).
    preds = torch.tensor([[0.30, 0.5, 0.1, 0.1], [0.80, 0.5, 0.1, 0.1]])
    targets_boxes = torch.tensor([[0.40, 0.5, 0.1, 0.1], [0.10, 0.5, 0.1, 0.1]])
    outputs = {"pred_logits": torch.zeros(1, 2, 3), "pred_boxes": preds[None]}
    matcher = HungarianMatcher(cost_class=0, cost_bbox=1, cost_giou=0)
    ((pred, tgt),) = matcher(outputs, [{"labels": torch.tensor([0, 1]), "boxes": targets_boxes}])
    assert dict(zip(tgt.tolist(), pred.tolist(), strict=True)) == {0: 1, 1: 0}


def _cost(prob: torch.Tensor, boxes: torch.Tensor, target: dict, i: int, j: int) -> float:
    """DETR's matching cost of prediction i and target j, computed directly."""
    l1 = (boxes[i] - target["boxes"][j]).abs().sum()
    giou = generalized_box_iou(box_cxcywh_to_xyxy(boxes[i : i + 1]), box_cxcywh_to_xyxy(target["boxes"][j : j + 1]))
    return float(-prob[i, target["labels"][j]] + 5 * l1 - 2 * giou[0, 0])


def test_matcher_minimises_total_cost_against_brute_force() -> None:
    generator = torch.Generator().manual_seed(0)
    matcher = build_matcher()
    for _ in range(20):
        n, m = 5, int(torch.randint(1, 5, (1,), generator=generator))
        cxcy = torch.rand(n, 2, generator=generator) * 0.6 + 0.2
        outputs = {
            "pred_logits": torch.randn(1, n, 4, generator=generator),
            "pred_boxes": torch.cat([cxcy, torch.rand(n, 2, generator=generator) * 0.2 + 0.05], 1)[None],
        }
        target = {
            "labels": torch.randint(0, 3, (m,), generator=generator),
            "boxes": torch.cat([torch.rand(m, 2, generator=generator) * 0.6 + 0.2, torch.full((m, 2), 0.1)], 1),
        }
        ((pred, tgt),) = matcher(outputs, [target])
        prob = outputs["pred_logits"][0].softmax(-1)
        boxes = outputs["pred_boxes"][0]

        found = sum(_cost(prob, boxes, target, i, j) for i, j in zip(pred.tolist(), tgt.tolist(), strict=True))
        best = min(
            sum(_cost(prob, boxes, target, i, j) for j, i in enumerate(perm))
            for perm in itertools.permutations(range(n), m)
        )
        assert len(pred) == m and sorted(tgt.tolist()) == list(range(m))
        assert found == pytest.approx(best, abs=1e-5)


def test_matcher_handles_images_without_objects() -> None:
    outputs = {"pred_logits": torch.zeros(2, 3, 3), "pred_boxes": torch.full((2, 3, 4), 0.5)}
    targets = [
        {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])},
    ]
    (pred0, tgt0), (pred1, tgt1) = build_matcher()(outputs, targets)
    assert len(pred0) == len(tgt0) == 0
    assert len(pred1) == len(tgt1) == 1


def test_the_focal_class_cost_by_hand() -> None:
    """Deformable DETR: alpha (1 - p)^gamma (-log p) - (1 - alpha) p^gamma (-log(1 - p)), p = sigmoid."""
    import math

    from models.matcher import focal_class_cost

    logits = torch.tensor([[2.0, -1.0, 0.0]])  # one prediction, three classes
    cost = focal_class_cost(logits, torch.tensor([0, 1]))
    for j, x in enumerate((2.0, -1.0)):
        p = 1 / (1 + math.exp(-x))
        expected = 0.25 * (1 - p) ** 2 * -math.log(p) - 0.75 * p**2 * -math.log(1 - p)
        assert cost[0, j].item() == pytest.approx(expected, rel=1e-5)
    assert cost[0, 0] < cost[0, 1]  # the confident class is the cheaper match


def test_the_focal_matcher_pairs_by_sigmoid_confidence() -> None:
    # Two predictions with the same box; only their class scores tell them apart.
    logits = torch.tensor([[[-4.0, 3.0], [3.0, -4.0]]])  # prediction 0 says class 1, prediction 1 class 0
    boxes = torch.full((1, 2, 4), 0.3)
    targets = [{"labels": torch.tensor([0, 1]), "boxes": torch.full((2, 4), 0.3)}]
    rows, cols = build_matcher(cost_class=2.0, class_cost="focal")(
        {"pred_logits": logits, "pred_boxes": boxes}, targets
    )[0]
    assert dict(zip(rows.tolist(), cols.tolist(), strict=True)) == {0: 1, 1: 0}
