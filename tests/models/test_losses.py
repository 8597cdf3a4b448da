"""DETR's set loss on hand-built cases."""

from __future__ import annotations

import math

import pytest
import torch

from models.losses import WEIGHTS, build_criterion

NUM_CLASSES = 4


def _targets() -> list[dict[str, torch.Tensor]]:
    return [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.1], [0.7, 0.6, 0.1, 0.3]])},
        {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]


def _random_outputs(seed: int = 0, queries: int = 6, aux: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def one() -> dict[str, torch.Tensor]:
        return {
            "pred_logits": torch.randn(2, queries, NUM_CLASSES + 1, generator=generator),
            "pred_boxes": torch.rand(2, queries, 4, generator=generator) * 0.5 + 0.2,
        }

    outputs = one()
    if aux:
        outputs["aux_outputs"] = [one() for _ in range(aux)]
    return outputs


def test_permuting_the_targets_leaves_the_loss_unchanged() -> None:
    criterion = build_criterion(NUM_CLASSES)
    outputs = _random_outputs(aux=2)
    targets = _targets()
    permuted = [{"labels": t["labels"].flip(0), "boxes": t["boxes"].flip(0)} for t in targets]
    a, b = criterion(outputs, targets), criterion(outputs, permuted)
    assert set(a) == set(b)
    for name in a:
        assert a[name].item() == pytest.approx(b[name].item(), abs=1e-6), name


def test_permuting_the_predictions_leaves_the_loss_unchanged() -> None:
    criterion = build_criterion(NUM_CLASSES)
    outputs = _random_outputs()
    order = torch.tensor([5, 2, 0, 4, 1, 3])
    shuffled = {k: v[:, order] for k, v in outputs.items()}
    assert criterion(outputs, _targets())["loss"].item() == pytest.approx(
        criterion(shuffled, _targets())["loss"].item(), abs=1e-6
    )


def test_a_perfect_prediction_has_no_box_loss_and_little_class_loss() -> None:
    targets = _targets()
    queries = 4
    logits = torch.full((2, queries, NUM_CLASSES + 1), -20.0)
    logits[..., NUM_CLASSES] = 20.0  # every query says "no object"...
    boxes = torch.full((2, queries, 4), 0.5)
    for b, target in enumerate(targets):  # ...except one per object, in a scrambled slot
        for k, (label, box) in enumerate(zip(target["labels"], target["boxes"], strict=True)):
            slot = queries - 1 - k
            logits[b, slot] = -20.0
            logits[b, slot, label] = 20.0
            boxes[b, slot] = box
    losses = build_criterion(NUM_CLASSES)({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["loss_giou"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["loss_ce"].item() < 1e-6
    assert losses["cardinality_error"].item() == 0.0


def test_class_loss_weights_no_object_by_eos_coef() -> None:
    # One image, two queries, one target of class 0 matched to query 0 (its box is exact).
    logits = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]])  # (1, 2, 2 + 1)
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1]]])
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    losses = build_criterion(2, eos_coef=0.1)({"pred_logits": logits, "pred_boxes": boxes}, targets)
    nll_0 = -math.log(math.e / (math.e + 2))  # query 0 -> class 0
    nll_1 = -math.log(math.e**2 / (math.e**2 + 2))  # query 1 -> "no object", weight 0.1
    assert losses["loss_ce"].item() == pytest.approx((nll_0 + 0.1 * nll_1) / 1.1, rel=1e-5)


def test_l1_and_giou_are_summed_over_boxes_and_divided_by_their_count() -> None:
    logits = torch.zeros(1, 1, 3)
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2]]])
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.6, 0.5, 0.2, 0.2]])}]
    losses = build_criterion(2)({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == pytest.approx(0.1, abs=1e-6)
    # xyxy [0.4, 0.4, 0.6, 0.6] vs [0.5, 0.4, 0.7, 0.6]: inter 0.02, union 0.06, enclosing 0.06.
    assert losses["loss_giou"].item() == pytest.approx(1 - 1 / 3, abs=1e-6)


def test_auxiliary_losses_are_named_by_layer_and_summed_into_the_total() -> None:
    losses = build_criterion(NUM_CLASSES)(_random_outputs(aux=2), _targets())
    names = {"loss_ce", "loss_bbox", "loss_giou"}
    assert names | {f"{n}_{i}" for n in names for i in (0, 1)} | {"loss", "cardinality_error"} == set(losses)
    total = sum(WEIGHTS[n] * (losses[n] + losses[f"{n}_0"] + losses[f"{n}_1"]) for n in names)
    assert losses["loss"].item() == pytest.approx(total.item(), rel=1e-6)


def test_the_loss_has_gradients_for_logits_and_boxes() -> None:
    outputs = _random_outputs()
    for tensor in outputs.values():
        tensor.requires_grad_(True)
    build_criterion(NUM_CLASSES)(outputs, _targets())["loss"].backward()
    assert outputs["pred_logits"].grad.abs().sum() > 0 and outputs["pred_boxes"].grad.abs().sum() > 0


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sigmoid_focal_loss_by_hand() -> None:
    """Lin et al. 2017, Eq. 5 with alpha: -alpha_t (1 - p_t)^gamma log p_t, summed."""
    from models.losses import sigmoid_focal_loss

    logits = torch.tensor([[2.0, -1.0], [0.5, 3.0]])
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = [[_sigmoid(2.0), _sigmoid(-1.0)], [_sigmoid(0.5), _sigmoid(3.0)]]
    positive = [0.25 * (1 - p[0][0]) ** 2 * -math.log(p[0][0]), 0.25 * (1 - p[1][1]) ** 2 * -math.log(p[1][1])]
    negative = [0.75 * p[0][1] ** 2 * -math.log(1 - p[0][1]), 0.75 * p[1][0] ** 2 * -math.log(1 - p[1][0])]
    assert sigmoid_focal_loss(logits, targets).item() == pytest.approx(sum(positive) + sum(negative), rel=1e-6)
    # gamma 0 and alpha 0.5: half the binary cross-entropy.
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
    assert sigmoid_focal_loss(logits, targets, alpha=0.5, gamma=0.0).item() == pytest.approx(0.5 * bce.item())


def test_the_focal_criterion_by_hand() -> None:
    """Deformable DETR's class loss: one-hot on the matched query, zeros elsewhere, over num_boxes; weight 2."""
    logits = torch.tensor([[[1.0, -2.0], [-1.0, 0.0]]])  # (1, 2 queries, 2 classes): no "no object"
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1]]])
    targets = [{"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    criterion = build_criterion(2, class_loss="focal")
    losses = criterion({"pred_logits": logits, "pred_boxes": boxes}, targets)

    def fl(x: float, positive: bool) -> float:
        p = _sigmoid(x)
        return 0.25 * (1 - p) ** 2 * -math.log(p) if positive else 0.75 * p**2 * -math.log(1 - p)

    expected = fl(1.0, True) + fl(-2.0, False) + fl(-1.0, False) + fl(0.0, False)  # query 0 matched to class 0
    assert "loss_ce" not in losses and losses["loss_focal"].item() == pytest.approx(expected / 1, rel=1e-6)
    assert losses["loss_bbox"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["loss"].item() == pytest.approx(2 * expected + 2 * losses["loss_giou"].item(), rel=1e-5)
    assert losses["cardinality_error"].item() == 0.0  # only query 0 has a class over 0.5


def test_groups_are_matched_each_on_its_own_and_averaged() -> None:
    """Group DETR: every group matched one-to-one; here group 1 is group 0 with its queries reversed."""
    outputs = _random_outputs(queries=6)
    single = build_criterion(NUM_CLASSES)(outputs, _targets())
    grouped_outputs = {k: torch.cat([v, v.flip(1)], dim=1) for k, v in outputs.items()}  # (2, 12, ...)
    grouped = build_criterion(NUM_CLASSES, num_groups=2)(grouped_outputs, _targets())
    for name in ("loss_ce", "loss_bbox", "loss_giou", "loss"):
        assert grouped[name].item() == pytest.approx(single[name].item(), rel=1e-5), name
    # A second group that is wrong everywhere raises the average.
    bad = {k: torch.cat([v, torch.zeros_like(v)], dim=1) for k, v in outputs.items()}
    assert build_criterion(NUM_CLASSES, num_groups=2)(bad, _targets())["loss_bbox"] > single["loss_bbox"]


def test_an_unknown_class_loss_is_refused() -> None:
    with pytest.raises(ValueError, match="focal"):
        build_criterion(NUM_CLASSES, class_loss="hinge")
