"""Stochastic weight averaging of CIFAR-10 runs: the mean of the weights, BatchNorm re-estimated."""

from __future__ import annotations

import pytest
import torch


def test_average_state_dicts_is_the_mean_of_floats_and_keeps_integer_buffers() -> None:
    from models.average_checkpoints import average_state_dicts

    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(7)}
    averaged = average_state_dicts([a, b])
    assert torch.equal(averaged["w"], torch.tensor([2.0, 4.0])) and averaged["w"].dtype == torch.float32
    assert int(averaged["n"]) == 3


def test_two_runs_average_into_an_exportable_checkpoint_and_other_models_are_refused(tmp_path, cifar_archive) -> None:
    from export.checkpoint import export_checkpoint
    from models.average_checkpoints import average
    from models.train_cifar import train

    path = cifar_archive
    small = {"epochs": 1, "batch_size": 16, "data": path, "limit_per_class": 4, "compile": False, "quiet": True}
    train(tmp_path / "a", arch="vit", seed=0, **small)
    train(tmp_path / "b", arch="vit", seed=1, **small)
    paths = [tmp_path / "a" / "checkpoint.pt", tmp_path / "b" / "checkpoint.pt"]
    metrics = average(paths, tmp_path / "swa", erase=0.25, data=path, limit_per_class=4)

    sources = [torch.load(p, weights_only=False)["state_dict"] for p in paths]
    averaged = torch.load(tmp_path / "swa" / "checkpoint.pt", weights_only=False)
    statistics = ("running_mean", "running_var", "num_batches_tracked")
    weights = [name for name in sources[0] if not name.endswith(statistics)]
    assert len(weights) > 50
    for name in weights:
        assert torch.allclose(averaged["state_dict"][name], (sources[0][name] + sources[1][name]) / 2, atol=1e-6)
    # the conv stem's BatchNorm: re-estimated on the training split, not the mean of the runs'
    means = [name for name in sources[0] if name.endswith("running_mean")]
    assert metrics["batchnorm_layers_reestimated"] == len(means) > 0
    assert not any(torch.allclose(averaged["state_dict"][n], (sources[0][n] + sources[1][n]) / 2) for n in means)
    assert metrics["averaged_test_accuracies"] == [
        torch.load(p, weights_only=False)["metrics"]["test_accuracy"] for p in paths
    ]
    assert metrics["epochs"] == 2 and 0.0 <= metrics["test_accuracy"] <= 1.0
    # both runs' commands, then the averaging
    assert averaged["recipe"].count("; then ") == 2
    assert averaged["recipe"].endswith(f"--out {tmp_path / 'swa'} --erase 0.25")
    assert metrics["batchnorm_augmentation"] == {"crop_padding": 4, "flip": True, "erase": 0.25}
    manifest = export_checkpoint(tmp_path / "swa" / "checkpoint.pt", tmp_path / "repo" / "1", opset=18)
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4

    other = torch.load(paths[1], weights_only=False)
    torch.save({**other, "config": {**other["config"], "depth": 1}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"differs .* in config"):
        average([paths[0], tmp_path / "other.pt"], tmp_path / "bad", data=path, limit_per_class=4)
    with pytest.raises(ValueError, match="at least two"):
        average(paths[:1], tmp_path / "bad", data=path, limit_per_class=4)


def test_batchnorm_is_re_estimated_on_batches_augmented_as_the_runs_trained() -> None:
    from torch import nn

    from models.average_checkpoints import update_batchnorm

    images = torch.full((64, 3, 8, 8), 153, dtype=torch.uint8)  # (153 / 255 - 0.5) / 0.25 = 0.4
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25)
    clean = nn.Sequential(nn.BatchNorm2d(3))
    assert update_batchnorm(clean, images, mean, std, batch_size=16) == 1
    # crop (reflect padding) and flip keep a uniform image uniform
    assert torch.allclose(clean[0].running_mean, torch.full((3,), 0.4), atol=1e-5)
    assert float(clean[0].running_var.max()) < 1e-6
    # random erasing puts N(0, 1) noise in a rectangle of every image: its statistics see it
    erased = nn.Sequential(nn.BatchNorm2d(3))
    update_batchnorm(erased, images, mean, std, batch_size=16, erase=1.0)
    assert float(erased[0].running_var.min()) > 0.02
    assert not erased.training
