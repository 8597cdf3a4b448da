"""SWA over one-epoch cosine cycles from a finished run (``models.swa_cycles``)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_cycles_start_each_from_the_last_and_their_ends_are_averaged_once(tmp_path, cifar_archive) -> None:
    from models.swa_cycles import run_cycles
    from models.train_cifar import train

    small = {"batch_size": 16, "data": cifar_archive, "limit_per_class": 4, "compile": False, "quiet": True}
    train(tmp_path / "run", arch="vit", epochs=1, seed=0, **small)
    start = tmp_path / "run" / "checkpoint.pt"
    metrics = run_cycles(start, tmp_path / "swa", cycles=3, lr=1e-4, seed=7, arch="vit", **small)

    ends = [tmp_path / "swa" / f"cycle-{k}" / "checkpoint.pt" for k in (1, 2, 3)]
    cycles = [torch.load(end, weights_only=False) for end in ends]
    # a chain: each cycle starts from the one before, with its own seed, one epoch, no warm-up
    assert [c["metrics"]["initialised_from"] for c in cycles] == [str(start), str(ends[0]), str(ends[1])]
    assert [c["metrics"]["seed"] for c in cycles] == [8, 9, 10]
    assert all(c["metrics"]["epochs"] == 1 for c in cycles)
    averaged = torch.load(tmp_path / "swa" / "checkpoint.pt", weights_only=False)["state_dict"]
    name = "head.weight" if "head.weight" in averaged else next(n for n in averaged if n.endswith("weight"))
    expected = torch.stack([c["state_dict"][name] for c in cycles]).mean(dim=0)
    assert torch.allclose(averaged[name], expected, atol=1e-6)
    assert metrics["averaged_test_accuracies"] == [c["metrics"]["test_accuracy"] for c in cycles]
    assert metrics["start_test_accuracy"] == torch.load(start, weights_only=False)["metrics"]["test_accuracy"]
    assert metrics["cycles"] == 3 and metrics["cycle_seeds"] == [8, 9, 10]
    assert metrics["recipe"].startswith(f"python -m models.swa_cycles {start}") and "--arch=vit" in metrics["recipe"]
    assert (tmp_path / "swa" / "training_curves.png").stat().st_size > 1000

    # resumable by cycle: a finished cycle is not run again
    before = [end.stat().st_mtime_ns for end in ends]
    (tmp_path / "swa" / "cycle-3" / "checkpoint.pt").unlink()
    run_cycles(start, tmp_path / "swa", cycles=3, lr=1e-4, seed=7, arch="vit", **small)
    assert [end.stat().st_mtime_ns for end in ends[:2]] == before[:2]
    assert ends[2].exists()

    with pytest.raises(ValueError, match="at least two"):
        run_cycles(start, tmp_path / "bad", cycles=1, lr=1e-4, arch="vit", **small)
