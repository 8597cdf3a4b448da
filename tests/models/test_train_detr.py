"""The DETR training command on a tiny run: checkpoint contents, curves, resume, targets as served."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.detection_data import make_split
from models.train_detr import LABELS, PREPROCESSING, learning_rate_factor, to_inputs_and_targets, train

SIZES = {"train": 12, "val": 4, "test": 4}


def test_targets_are_normalised_in_the_letterboxed_frame() -> None:
    canvases = make_split("test", 3)
    inputs, targets = to_inputs_and_targets(canvases)
    assert inputs.shape == (3, 1, 128, 128) and inputs.dtype == torch.float32
    for canvas, x, target in zip(canvases, inputs, targets, strict=True):
        height, width = canvas.image.shape
        scale = 128 / max(width, height)  # letterbox: the longer side becomes 128
        cx, cy, w, h = target["boxes"].T.numpy()
        # Back to pixels (within the rounding of the content size): the canvas's own boxes.
        np.testing.assert_allclose((cx - w / 2) * 128 / scale, canvas.boxes[:, 0], atol=0.6)
        np.testing.assert_allclose((cy + h / 2) * 128 / scale, canvas.boxes[:, 3], atol=0.6)
        np.testing.assert_allclose(w * 128 / scale, canvas.boxes[:, 2] - canvas.boxes[:, 0], atol=0.6)
        assert torch.equal(target["labels"], torch.from_numpy(canvas.labels))
        content_h = round(height * scale)
        assert torch.all(x[0, content_h:, :] == 0)  # the padding below the image


def test_schedule_warms_up_then_drops_once() -> None:
    factors = [learning_rate_factor(s, warmup_steps=4, lr_drop=10) for s in (0, 3, 4, 9, 10, 50)]
    assert factors == [0.25, 1.0, 1.0, 1.0, 0.1, 0.1]


@pytest.mark.slow
def test_a_tiny_run_writes_what_export_needs_and_resumes(tmp_path) -> None:
    out = tmp_path / "run"
    metrics = train(
        out,
        data=None,
        steps=4,
        lr_drop=3,
        warmup_steps=2,
        eval_every=2,
        split_sizes=SIZES,
        pretrain_steps=2,
        quiet=True,
    )
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
    assert checkpoint["architecture"] == "detr" and checkpoint["labels"] == LABELS
    assert checkpoint["preprocessing"] == PREPROCESSING and checkpoint["split_sizes"] == SIZES
    assert checkpoint["config"]["num_queries"] == 25 and "transformer.decoder_norm.weight" in checkpoint["state_dict"]
    assert json.loads((out / "metrics.json").read_text()) == checkpoint["metrics"] == metrics
    assert 0 <= metrics["test_AP"] <= 1 and metrics["test_images"] == 4 and metrics["steps"] == 4
    assert 0 <= metrics["pretrain_val_accuracy"] <= 1
    for split in ("val", "test"):  # what users see at threshold 0.5, beside AP
        assert 0 <= metrics[f"{split}_duplicate_canvas_fraction"] <= 1
        assert 0 <= metrics[f"{split}_precision"] <= 1 and 0 <= metrics[f"{split}_recall"] <= 1
    assert checkpoint["postprocess"] == "softmax" and checkpoint["pixel_mask"] is False
    assert metrics["class_loss"] == "softmax" and metrics["groups"] == 1 and metrics["inputs"] == "letterbox"
    assert "cores available" in metrics["device"]
    assert (out / "training_curves.png").stat().st_size > 10_000

    last = torch.load(out / "last.pt", weights_only=False)
    assert last["step"] == 4 and [s for s, _ in last["history"]["val AP"]] == [2, 4]
    assert [s for s, _ in last["history"]["val duplicate_canvas_fraction"]] == [2, 4]
    train(
        out,
        data=None,
        steps=6,
        lr_drop=3,
        warmup_steps=2,
        eval_every=2,
        split_sizes=SIZES,
        resume=out / "last.pt",
        quiet=True,
    )
    resumed = torch.load(out / "last.pt", weights_only=False)
    assert resumed["step"] == 6 and [s for s, _ in resumed["history"]["val AP"]] == [2, 4, 6]
    assert len(resumed["history"]["train loss"]) == 6


@pytest.mark.slow
def test_backbone_pretraining_learns_to_tell_digits_apart() -> None:
    from models.detr import build
    from models.train_detr import pretrain_backbone

    torch.manual_seed(0)
    backbone = build("digits-small").backbone
    before = [p.detach().clone() for p in backbone.parameters()]
    result = pretrain_backbone(backbone, steps=150, batch_size=32, lr=3e-3, quiet=True)
    assert result["pretrain_val_accuracy"] > 0.5  # chance is 0.1; 0.77 measured; 0.99 with the recipe's 1,000 steps
    assert any(not torch.equal(a, b) for a, b in zip(before, backbone.parameters(), strict=True))


TINY = {"data": None, "steps": 2, "lr_drop": 1, "warmup_steps": 1, "eval_every": 2, "batch_size": 4}


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"class_loss": "focal"},
        {"groups": 2},
        {"overrides": {"num_queries": 10, "num_decoder_layers": 4}},
        {"inputs": "bucket"},
        {"overrides": {"dn_groups": 2}},
    ],
    ids=["focal", "groups", "overrides", "bucket", "denoising"],
)
def test_each_recipe_lever_trains_and_writes_what_export_needs(tmp_path, options) -> None:
    out = tmp_path / "run"
    metrics = train(out, **TINY, split_sizes=SIZES, pretrain_steps=0, quiet=True, **options)
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
    config, state = checkpoint["config"], checkpoint["state_dict"]
    assert json.loads((out / "metrics.json").read_text()) == checkpoint["metrics"] == metrics
    assert 0 <= metrics["val_duplicate_canvas_fraction"] <= 1 and 0 <= metrics["test_AP"] <= 1
    focal = options.get("class_loss") == "focal"
    assert checkpoint["postprocess"] == metrics["class_loss"].replace("focal", "sigmoid")
    assert checkpoint["labels"] == (LABELS[:-1] if focal else LABELS)
    assert config["class_head"] == ("sigmoid" if focal else "softmax")
    assert state["class_embed.weight"].shape[0] == (10 if focal else 11)
    # Group DETR's extra groups are training-only: the checkpoint holds group 0.
    assert config["num_groups"] == 1 and metrics["groups"] == options.get("groups", 1)
    assert config["dn_groups"] == 0 and not any(k.startswith("dn_") for k in state)  # DN-DETR: training only
    queries = options.get("overrides", {}).get("num_queries", 25)
    assert state["query_embed.weight"].shape == (queries, 128) and config["num_queries"] == queries
    assert config["num_decoder_layers"] == options.get("overrides", {}).get("num_decoder_layers", 3)
    masked = options.get("inputs") == "bucket"
    assert checkpoint["pixel_mask"] is masked and metrics["inputs"] == options.get("inputs", "letterbox")
    assert checkpoint["preprocessing"]["resize"] == ("fit" if masked else "letterbox")


@pytest.mark.slow
def test_a_schedule_longer_than_a_sitting_resumes_to_the_same_end(tmp_path) -> None:
    out = tmp_path / "run"
    options = {**TINY, "steps": 4, "split_sizes": SIZES, "pretrain_steps": 0, "quiet": True}
    first = train(out, **options, sitting_steps=3)
    assert first == {"step": 3, "steps": 4} and not (out / "checkpoint.pt").exists()
    assert torch.load(out / "last.pt", weights_only=False)["step"] == 3
    metrics = train(out, **options, sitting_steps=3, resume=out / "last.pt")
    assert metrics["steps"] == 4 and (out / "checkpoint.pt").exists()
    last = torch.load(out / "last.pt", weights_only=False)
    assert last["step"] == 4 and len(last["history"]["train loss"]) == 4


def test_groups_and_class_loss_are_not_set_through_overrides(tmp_path) -> None:
    with pytest.raises(ValueError, match="--groups"):
        train(tmp_path, **TINY, overrides={"num_groups": 3}, quiet=True)


@pytest.mark.slow
def test_a_fine_tune_starts_from_a_runs_weights_on_augmented_canvases(tmp_path) -> None:
    options = {**TINY, "steps": 2, "split_sizes": SIZES, "pretrain_steps": 0, "quiet": True}
    train(tmp_path / "first", **options)
    first = torch.load(tmp_path / "first" / "last.pt", weights_only=False)["state_dict"]
    out, other_seed = tmp_path / "tuned", {**options, "seed": 1}  # its own initial weights would differ
    stopped = train(out, **other_seed, init=tmp_path / "first" / "last.pt", augment_digits=True, sitting_steps=1)
    assert stopped == {"step": 1, "steps": 2}
    resumed = train(
        out, **other_seed, init=tmp_path / "first" / "last.pt", augment_digits=True, resume=out / "last.pt"
    )  # the same flags in a later sitting: the run's own last.pt wins
    assert resumed["initialised_from"] == str(tmp_path / "first" / "last.pt") and resumed["initial_step"] == 2
    assert resumed["augment_digits"] is True and resumed["steps"] == 2
    tuned = torch.load(out / "last.pt", weights_only=False)
    assert tuned["step"] == 2 and len(tuned["history"]["train loss"]) == 2  # its own steps, not the first run's
    # Two small steps from the first run's weights stay near them; the same seed from scratch is far.
    train(tmp_path / "scratch", **other_seed)
    scratch = torch.load(tmp_path / "scratch" / "last.pt", weights_only=False)["state_dict"]
    name = "query_embed.weight"
    near = (tuned["state_dict"][name] - first[name]).abs().max()
    assert 0 < near < 0.01 < (scratch[name] - first[name]).abs().max()


@pytest.mark.slow
def test_the_device_is_chosen_and_recorded(tmp_path) -> None:
    # A GPU run records its card (untested here: no GPU); on this machine the automatic choice is the CPU.
    options = {**TINY, "steps": 2, "split_sizes": SIZES, "pretrain_steps": 2, "quiet": True}
    explicit = train(tmp_path / "cpu", **options, device="cpu")
    automatic = train(tmp_path / "auto", **options)
    if torch.cuda.is_available():
        pytest.skip("the automatic choice is the GPU here")
    # the device string ends with the load average at the end of the run, which varies between the two runs
    machine = [run["device"].rsplit(", load ", 1)[0] for run in (explicit, automatic)]
    assert explicit["test_AP"] == automatic["test_AP"] and machine[0] == machine[1] and "cores available" in machine[0]
    assert "; " not in explicit["device"]  # no card named
    saved = torch.load(tmp_path / "cpu" / "checkpoint.pt", weights_only=False)["state_dict"]
    assert saved and all(tensor.device.type == "cpu" for tensor in saved.values())
