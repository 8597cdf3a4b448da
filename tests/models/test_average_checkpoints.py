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
    metrics = average(paths, tmp_path / "swa", data=path, limit_per_class=4)

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
    assert averaged["recipe"].count("; then ") == 2 and averaged["recipe"].endswith(f"--out {tmp_path / 'swa'}")
    manifest = export_checkpoint(tmp_path / "swa" / "checkpoint.pt", tmp_path / "repo" / "1", opset=18)
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4

    other = torch.load(paths[1], weights_only=False)
    torch.save({**other, "config": {**other["config"], "depth": 1}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"differs .* in config"):
        average([paths[0], tmp_path / "other.pt"], tmp_path / "bad", data=path, limit_per_class=4)
    with pytest.raises(ValueError, match="at least two"):
        average(paths[:1], tmp_path / "bad", data=path, limit_per_class=4)
