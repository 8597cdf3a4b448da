"""The benchmark's trained models are served one version each, as the naive endpoint and LitServe serve them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.profile import profiled
from bench.run import one_model_repository, trained_models


def test_a_trained_model_is_benchmarked_as_one_version_alone(tmp_path: Path) -> None:
    # vit-cifar10's config.json serves its two highest versions; linking its folder made patchserve
    # serve both (each with half the cores) against (e) and (f) serving one.
    repository = tmp_path / "model_repository"
    for version in (1, 2):
        folder = repository / "vit-cifar10" / str(version)
        folder.mkdir(parents=True)
        (folder / "model.json").write_text(
            (Path(__file__).parents[2] / "model_repository" / "vit-cifar10" / "2" / "model.json").read_text()
        )
    (repository / "vit-cifar10" / "config.json").write_text(
        json.dumps({"version_policy": {"latest": {"num_versions": 2}}})
    )
    [(name, version_dir)] = trained_models(repository)
    assert (name, version_dir.name) == ("vit-cifar10", "2")
    alone = one_model_repository(tmp_path / "work", name, version_dir)
    model = alone / "vit-cifar10"
    assert sorted(p.name for p in model.iterdir()) == ["2"]  # no version 1, no config.json: latest 1 serves it
    assert (model / "2").resolve() == version_dir.resolve()
    assert one_model_repository(tmp_path / "work", name, version_dir) == alone  # a second run reuses it


def test_the_profile_serves_the_same_one_version_to_both_servers(tmp_path: Path) -> None:
    model = tmp_path / "model_repository" / "vit-cifar10"
    for version in (1, 2):
        (model / str(version)).mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"version_policy": {"latest": {"num_versions": 2}}}))
    repository, name, version = profiled(model, tmp_path / "work")
    assert (name, version) == ("vit-cifar10", "2")
    assert sorted(p.name for p in (repository / name).iterdir()) == ["2"]  # version 1 and config.json left out
    bench = tmp_path / "work" / "model_repository" / "vit-ti16-random" / "1"
    bench.mkdir(parents=True)
    assert profiled(None, tmp_path / "work") == (bench.parents[1], "vit-ti16-random", "1")
