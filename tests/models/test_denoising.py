"""DN-DETR's denoising queries: the noise, the attention mask, the model's split outputs, the loss."""

from __future__ import annotations

import pytest
import torch

from models.denoising import attention_mask, noised_queries
from models.detr import build, for_inference
from models.losses import build_criterion


def _targets() -> list[dict[str, torch.Tensor]]:
    return [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.1], [0.7, 0.6, 0.1, 0.3]])},
        {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
    ]


def test_noise_stays_within_dn_detrs_bounds() -> None:
    """Li et al. 2022, Sec. 3.2: |dx| < lambda w / 2, w' in [(1 - lambda) w, (1 + lambda) w], lambda 0.4."""
    targets = [{"labels": torch.full((50,), 2), "boxes": torch.tensor([0.5, 0.5, 0.2, 0.3]).repeat(50, 1)}] * 4
    dn = noised_queries(targets, 20, 10, generator=torch.Generator().manual_seed(0))
    boxes = dn["boxes"].reshape(-1, 4)
    assert dn["labels"].shape == (4, 1000) and boxes.shape == (4000, 4) and dn["valid"].all()
    assert (boxes[:, 0] - 0.5).abs().max() <= 0.4 * 0.2 / 2 + 1e-6
    assert (boxes[:, 1] - 0.5).abs().max() <= 0.4 * 0.3 / 2 + 1e-6
    assert boxes[:, 2].min() >= 0.6 * 0.2 - 1e-6 and boxes[:, 2].max() <= 1.4 * 0.2 + 1e-6
    assert boxes[:, 3].min() >= 0.6 * 0.3 - 1e-6 and boxes[:, 3].max() <= 1.4 * 0.3 + 1e-6
    changed = (dn["labels"] != 2).float().mean().item()  # flipped with p 0.2, to the same class 1 time in 10
    assert 0.15 < changed < 0.21
    assert torch.equal(dn["target_labels"], torch.full((4, 1000), 2))


def test_groups_repeat_the_objects_and_pad_the_shorter_images() -> None:
    dn = noised_queries(_targets(), 3, 4, label_noise=0.0, box_noise=0.0)
    assert int(dn["group_size"]) == 2 and dn["labels"].shape == (2, 6)
    assert dn["target_labels"].tolist() == [[1, 3, 1, 3, 1, 3], [0, 4, 0, 4, 0, 4]]  # 4: a padding slot
    assert dn["valid"].tolist() == [[True] * 6, [True, False] * 3]
    torch.testing.assert_close(dn["boxes"][0, 2:4], _targets()[0]["boxes"])  # no noise: the objects


def test_the_attention_mask_by_hand() -> None:
    """Sec. 3.3: matching queries never see denoising ones; denoising groups never see each other."""
    mask = attention_mask(torch.ones(2, 2, dtype=torch.bool), groups=2, group_size=1).int().tolist()
    assert mask == [
        [1, 1, 0, 0],  # matching query 0
        [1, 1, 0, 0],
        [1, 1, 1, 0],  # denoising group 0 sees the matching queries and itself
        [1, 1, 0, 1],  # denoising group 1
    ]


def test_denoising_queries_train_beside_the_matching_ones_and_never_reach_inference() -> None:
    torch.manual_seed(0)
    model = build("digits-small", num_queries=5, dn_groups=3)
    x = torch.randn(2, 1, 128, 128)
    with torch.no_grad():
        model.train().backbone.eval()
        with_dn = model(x, None, _targets())
        without = model(x)
        served = model.eval()(x, None, _targets())
    assert with_dn["pred_logits"].shape == (2, 5, 11) and with_dn["dn"]["pred_boxes"].shape == (2, 6, 4)
    assert len(with_dn["dn"]["aux_outputs"]) == 2
    # The matching queries cannot read the noised answers: their outputs do not change.
    torch.testing.assert_close(with_dn["pred_boxes"], without["pred_boxes"], atol=1e-5, rtol=0)
    assert "dn" not in without and "dn" not in served
    inference = for_inference(model)
    assert inference.config.dn_groups == 0 and not any(k.startswith("dn_") for k in inference.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(inference(x)["pred_boxes"], served["pred_boxes"], atol=0, rtol=0)


@pytest.mark.parametrize("class_loss", ["softmax", "focal"])
def test_the_reconstruction_loss_is_zero_box_loss_for_exact_reconstructions(class_loss) -> None:
    dn = noised_queries(_targets(), 2, 4)
    classes = 4 + (class_loss == "softmax")
    logits = torch.full((2, 4, classes), -9.0)
    logits[..., :4].scatter_(-1, dn["target_labels"].clamp(max=3)[..., None], 9.0)
    dn.update({"pred_logits": logits, "pred_boxes": dn["target_boxes"].clone()})
    outputs = {"pred_logits": torch.zeros(2, 3, classes), "pred_boxes": torch.full((2, 3, 4), 0.5), "dn": dn}
    losses = build_criterion(4, class_loss=class_loss)(outputs, _targets())
    name = "loss_focal" if class_loss == "focal" else "loss_ce"
    assert losses["loss_bbox_dn"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["loss_giou_dn"].item() == pytest.approx(0.0, abs=1e-6)
    assert 0 <= losses[f"{name}_dn"].item() < 1e-3
    plain = build_criterion(4, class_loss=class_loss)({k: v for k, v in outputs.items() if k != "dn"}, _targets())
    assert losses["loss"].item() == pytest.approx(
        plain["loss"].item()
        + sum(
            build_criterion(4, class_loss=class_loss).weights[n] * losses[f"{n}_dn"].item()
            for n in (name, "loss_bbox", "loss_giou")
        ),
        rel=1e-5,
    )
