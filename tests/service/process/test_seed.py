"""The containers' helpers: the Kubernetes init container's seeding (service/process/seed.py), the healthcheck."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from service.process import seed
from tests.conftest import MODEL_REPOSITORY


def test_a_fresh_volume_with_lost_and_found_is_seeded_with_every_model(tmp_path: Path) -> None:
    # An ops tester: the one-liner it replaces took lost+found for content, and left the volume empty.
    repository = tmp_path / "repository"
    (repository / "lost+found").mkdir(parents=True)
    copied = seed.seed(MODEL_REPOSITORY, repository)
    models = sorted(p.name for p in MODEL_REPOSITORY.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert copied == models
    assert sorted(os.listdir(repository)) == sorted(["lost+found", *models])  # no staging folder left
    first = next(MODEL_REPOSITORY.glob("*/*/model.json"))
    assert (repository / first.relative_to(MODEL_REPOSITORY)).read_bytes() == first.read_bytes()


def test_a_volume_that_holds_a_model_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "mine" / "1").mkdir(parents=True)
    assert seed.seed(MODEL_REPOSITORY, tmp_path) == []
    assert os.listdir(tmp_path) == ["mine"]
    assert seed.main([str(MODEL_REPOSITORY), str(tmp_path)]) == 0 and seed.main([]) == 2


def test_a_model_another_pod_seeded_first_is_not_copied_over(tmp_path: Path, monkeypatch) -> None:
    # Two pods of a first deploy seed at once: each copies under its own dot name; the rename of the
    # second finds the model there and its copy is dropped, so no server sees a half-copied folder.
    rename = os.rename

    def another_pod_was_first(source: str | Path, target: str | Path) -> None:
        if Path(target).name == "vit-digits":
            shutil.copytree(MODEL_REPOSITORY / "vit-digits", target)
        rename(source, target)

    monkeypatch.setattr(seed.os, "rename", another_pod_was_first)
    copied = seed.seed(MODEL_REPOSITORY, tmp_path)
    assert "vit-digits" not in copied and copied
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".")]


def test_the_healthcheck_asks_the_address_the_server_is_bound_to() -> None:
    # An ops tester: with PATCHSERVE_HOST set to one non-loopback address the container never got healthy.
    from service.process.healthcheck import ready_url

    assert ready_url({}) == "http://127.0.0.1:8000/readyz"
    assert ready_url({"PATCHSERVE_HOST": "0.0.0.0", "PATCHSERVE_PORT": "9000"}) == "http://127.0.0.1:9000/readyz"
    assert ready_url({"PATCHSERVE_HOST": "::"}) == "http://127.0.0.1:8000/readyz"
    assert ready_url({"PATCHSERVE_HOST": "10.1.2.3"}) == "http://10.1.2.3:8000/readyz"
    assert ready_url({"PATCHSERVE_HOST": "fd00::5"}) == "http://[fd00::5]:8000/readyz"


def test_a_source_that_is_missing_is_one_line_not_a_traceback(tmp_path: Path, capsys) -> None:
    # a tester's: `python -m service.process.seed model_repository /missing` died with a FileNotFoundError traceback
    from service.process.seed import main

    assert main([str(tmp_path / "missing"), str(tmp_path / "repository")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("seed: ") and "missing" in error and "Traceback" not in error and error.count("\n") == 1
