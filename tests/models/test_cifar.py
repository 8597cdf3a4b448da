"""CIFAR-10 from the JPEG archive: order, shapes, labels; and a tiny end-to-end training run."""

from __future__ import annotations

import io
import shlex
import sys
import zipfile

import numpy as np
import pytest
from PIL import Image

from models import cifar


def test_load_split_reads_classes_in_cifar_order(tmp_path) -> None:
    path = tmp_path / "tiny.zip"
    colours = {}
    with zipfile.ZipFile(path, "w") as archive:
        for class_id, label in enumerate(cifar.CIFAR10_LABELS):
            for n in (1, 0):  # written out of order: the loader sorts by name
                colour = (class_id * 20, n * 100, 50)
                colours[(label, n)] = colour
                buffer = io.BytesIO()
                Image.new("RGB", (32, 32), colour).save(buffer, format="JPEG", quality=100)
                archive.writestr(f"test/{label}/{n:04d}.jpg", buffer.getvalue())
    split = cifar.load_split("test", path)
    assert split.images.shape == (20, 32, 32, 3) and split.images.dtype == np.uint8
    assert split.labels.tolist() == [c for c in range(10) for _ in range(2)]
    for i, (label, n) in enumerate((label, n) for label in cifar.CIFAR10_LABELS for n in (0, 1)):
        assert np.abs(split.images[i].astype(int) - colours[(label, n)]).max() <= 3  # JPEG rounding
    assert len(cifar.load_split("test", path, limit_per_class=1).labels) == 10


def test_unknown_split_and_missing_archive_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="split must be"):
        cifar.load_split("valid", tmp_path / "x.zip")
    with pytest.raises(FileNotFoundError, match="PATCHSERVE_CIFAR10"):
        cifar.find_archive(tmp_path / "missing.zip")


def test_the_real_archive_has_the_standard_splits(cifar_archive) -> None:
    path = cifar_archive
    train, test = cifar.load_cifar10_splits(path, limit_per_class=3)
    assert train.images.shape == (30, 32, 32, 3) and test.images.shape == (30, 32, 32, 3)
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.endswith(".jpg")]
    assert sum(n.startswith("train/") for n in names) == 50_000
    assert sum(n.startswith("test/") for n in names) == 10_000


def test_a_tiny_training_run_writes_checkpoint_metrics_and_curves(tmp_path, cifar_archive) -> None:
    from models.train_cifar import train

    path = cifar_archive
    metrics = train(
        tmp_path, arch="cnn", epochs=2, batch_size=16, data=path, limit_per_class=8, compile=False, quiet=True
    )
    assert metrics["epochs"] == 2 and metrics["train_images"] == 80 and metrics["test_images"] == 80
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert metrics["device"].startswith(("cpu", "cuda"))
    for name in ("checkpoint.pt", "metrics.json", "history.json", "training_curves.png"):
        assert (tmp_path / name).is_file()
    assert not (tmp_path / "last.pt").exists()


def test_distillation_loss_is_half_true_labels_half_teacher_argmax() -> None:
    """DeiT's hard-label distillation, Touvron et al. 2021, Sec. 5.1, Eq. 3."""
    import torch
    from torch.nn import functional as F

    from models.augment import soft_cross_entropy, soft_targets
    from models.train_cifar import distillation_loss
    from models.vit import build

    torch.manual_seed(0)
    student = build("cifar10", distillation=True)
    teacher = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    x, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    targets = soft_targets(labels, 10, 0.1)
    loss = distillation_loss(student, teacher, x, targets)
    class_logits, distillation_logits = student(x, heads=True)
    expected = 0.5 * soft_cross_entropy(class_logits, targets) + 0.5 * F.cross_entropy(
        distillation_logits, teacher(x).argmax(1)
    )
    assert torch.allclose(loss, expected)
    loss.backward()
    assert student.head_dist.weight.grad is not None and student.dist_token.grad is not None
    assert all(p.grad is None for p in teacher.parameters())  # the teacher stays frozen


def test_a_tiny_deit_run_distils_from_a_cnn_checkpoint_and_exports(tmp_path, cifar_archive) -> None:
    import json

    from export.checkpoint import export_checkpoint
    from models.train_cifar import train

    path = cifar_archive
    small = {"epochs": 1, "batch_size": 16, "data": path, "limit_per_class": 4, "compile": False, "quiet": True}
    train(tmp_path / "cnn", arch="cnn", **small)
    with pytest.raises(ValueError, match="--teacher"):
        train(tmp_path / "deit", arch="deit", **small)
    metrics = train(tmp_path / "deit", arch="deit", teacher=tmp_path / "cnn" / "checkpoint.pt", erase=0.25, **small)
    assert 0.0 <= metrics["teacher_test_accuracy"] <= 1.0
    manifest = export_checkpoint(tmp_path / "deit" / "checkpoint.pt", tmp_path / "repo" / "1", opset=18)
    assert manifest.description.startswith("DeiT") and manifest.roles == {"logits": "logits", "embedding": "embedding"}
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    written = json.loads((tmp_path / "repo" / "1" / "model.json").read_text())
    assert written["outputs"] == ["logits", "embedding", "attentions"]
    assert written["attention"]["prefix_tokens"] == ["class", "distillation"]  # the rollout skips both

    # render=png draws the rollout over the 4x4 patch grid, past both prefix tokens
    import numpy as np
    import onnxruntime as ort

    from service.imaging.attention import rollout_grid
    from service.runtime.manifest import load_manifest

    served = load_manifest(tmp_path / "repo" / "1" / "model.json")
    session = ort.InferenceSession(str(tmp_path / "repo" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    attentions = session.run(["attentions"], {"pixel_values": x})[0]
    spec = served.attention
    heat = rollout_grid(attentions[0], (spec.grid.height, spec.grid.width), spec.prefix_tokens)
    assert heat.shape == (4, 4) and np.isfinite(heat).all()


def test_init_starts_from_an_earlier_checkpoint_and_refuses_another_architecture(tmp_path, cifar_archive) -> None:
    """``--init``: a warm restart from an earlier run's weights (fresh optimizer and schedule)."""
    import torch

    from models.train_cifar import train

    path = cifar_archive
    small = {"batch_size": 16, "data": path, "limit_per_class": 4, "compile": False, "quiet": True}
    first = train(tmp_path / "first", arch="vit", epochs=1, **small)
    earlier = torch.load(tmp_path / "first" / "checkpoint.pt", weights_only=False)["state_dict"]

    # a learning rate of 0 (AdamW's decay is lr * weight_decay): the weights are the earlier run's
    # (the conv stem's BatchNorm statistics still follow the new epoch's batches)
    same = train(tmp_path / "same", arch="vit", epochs=1, lr=0.0, init=tmp_path / "first" / "checkpoint.pt", **small)
    loaded = torch.load(tmp_path / "same" / "checkpoint.pt", weights_only=False)["state_dict"]
    weights = [name for name in earlier if not name.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert len(weights) > 50
    assert all(torch.equal(earlier[name], loaded[name]) for name in weights)
    assert same["initialised_from"] == str(tmp_path / "first" / "checkpoint.pt")
    assert same["initial_epochs"] == 1 and same["initial_test_accuracy"] == first["test_accuracy"]
    # the recipe names the run it started from first, as models.average_checkpoints' does
    command = "python -m models.train_cifar " + shlex.join(sys.argv[1:])  # pytest's command line here
    assert torch.load(tmp_path / "first" / "checkpoint.pt", weights_only=False)["recipe"] == command
    same_recipe = torch.load(tmp_path / "same" / "checkpoint.pt", weights_only=False)["recipe"]
    assert same_recipe == f"{command}; then {command}"
    bare = torch.load(tmp_path / "first" / "checkpoint.pt", weights_only=False)
    torch.save({k: v for k, v in bare.items() if k != "recipe"}, tmp_path / "bare.pt")  # one that records none
    train(tmp_path / "bare", arch="vit", epochs=1, lr=0.0, init=tmp_path / "bare.pt", **small)
    assert torch.load(tmp_path / "bare" / "checkpoint.pt", weights_only=False)["recipe"] == command

    # one more epoch moves them
    train(tmp_path / "more", arch="vit", epochs=1, lr=1e-4, init=tmp_path / "first" / "checkpoint.pt", **small)
    moved = torch.load(tmp_path / "more" / "checkpoint.pt", weights_only=False)["state_dict"]
    assert any(not torch.equal(earlier[name], moved[name]) for name in weights)

    with pytest.raises(ValueError, match="not a checkpoint of --arch cnn"):
        train(tmp_path / "cnn", arch="cnn", epochs=1, init=tmp_path / "first" / "checkpoint.pt", **small)

    # a finer grid (--upsample 2): the same weights, the patch position embeddings resampled
    from models.vit import resample_position_embedding

    train(
        tmp_path / "finer", arch="vit", epochs=1, lr=0.0, init=tmp_path / "first" / "checkpoint.pt", upsample=2, **small
    )
    finer = torch.load(tmp_path / "finer" / "checkpoint.pt", weights_only=False)["state_dict"]
    assert torch.equal(finer["pos_embed"], resample_position_embedding(earlier["pos_embed"], 1, 8))
    assert all(torch.equal(earlier[name], finer[name]) for name in weights if name != "pos_embed")
    other = torch.load(tmp_path / "first" / "checkpoint.pt", weights_only=False)
    torch.save({**other, "config": {**other["config"], "depth": 1}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="with this config"):
        train(tmp_path / "bad", arch="vit", epochs=1, init=tmp_path / "other.pt", upsample=2, **small)
    with pytest.raises(ValueError, match="--upsample is a ViT's"):
        train(tmp_path / "bad", arch="cnn", epochs=1, upsample=2, **small)


def test_a_sitting_ends_on_its_time_limit_and_the_run_resumes_to_the_end(tmp_path, cifar_archive) -> None:
    import torch

    from models.train_cifar import train

    small = {"arch": "cnn", "epochs": 3, "batch_size": 16, "data": cifar_archive, "limit_per_class": 4}
    small |= {"compile": False, "quiet": True}
    # a limit no epoch fits in: the sitting trains its first epoch (nothing to pace by yet), then stops
    stopped = train(tmp_path, **small, sitting_minutes=1e-6)
    assert stopped == {"epoch": 1, "epochs": 3}
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["epoch"] == 1 and not (tmp_path / "checkpoint.pt").exists()
    assert [s["epochs"] for s in state["sittings"]] == [[1, 1]] and state["sittings"][0]["device"].startswith("cpu")
    assert not (tmp_path / "last.pt.partial").exists()  # saved whole, then renamed
    metrics = train(tmp_path, **small, resume=True)
    assert metrics["epochs"] == 3 and [s["epochs"] for s in metrics["sittings"]] == [[1, 1], [2, 3]]
    assert not (tmp_path / "last.pt").exists()


def test_a_last_pt_from_before_sittings_were_recorded_resumes_with_its_epochs_unattributed(
    tmp_path, cifar_archive
) -> None:
    import torch

    from models.train_cifar import train

    small = {"arch": "cnn", "epochs": 2, "batch_size": 16, "data": cifar_archive, "limit_per_class": 4}
    small |= {"compile": False, "quiet": True}
    train(tmp_path, **small, sitting_minutes=1e-6)
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    del state["sittings"]
    torch.save(state, tmp_path / "last.pt")
    metrics = train(tmp_path, **small, resume=True)
    assert metrics["sittings"][0] == {"epochs": [1, 1], "device": None, "seconds": round(state["elapsed"], 1)}
    assert metrics["sittings"][1]["epochs"] == [2, 2]
