"""Manifest validation: a bad value stops start-up with a message that names the file and the field."""

from __future__ import annotations

import json
import shutil

import pytest
from pydantic import ValidationError

from service.runtime.manifest import AttentionSpec, Manifest, ManifestError, load_manifest
from tests.conftest import MODEL_REPOSITORY
from tests.service.helpers import run_server

COMMITTED = MODEL_REPOSITORY / "vit-digits" / "1" / "model.json"


def broken_repository(tmp_path, edit) -> tuple:
    folder = tmp_path / "repo" / "vit-digits" / "1"
    shutil.copytree(COMMITTED.parent, folder)
    data = json.loads(COMMITTED.read_text())
    edit(data)
    (folder / "model.json").write_text(json.dumps(data))
    return tmp_path / "repo", folder / "model.json"


def test_committed_manifest_loads() -> None:
    manifest = load_manifest(COMMITTED)
    assert manifest.task == "classification" and manifest.input.shape[0] == "batch"


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.pop("task"), "task"),
        (lambda d: d["preprocessing"].update(colour="L"), "preprocessing.colour"),
        (lambda d: d["preprocessing"].update(mean=[0.1, 0.2]), "preprocessing"),
        (lambda d: d["input"].update(shape=[1, 1, 8, 8]), "input"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d.update(batching={"max_batch_size": 0}), "batching.max_batch_size"),
        (lambda d: d.update(batching={"max_delay": 0.01}), "batching.max_delay"),
        # Infinity (json's) and 1e303 s: found by a reviewer, /v2's config answered 500 (uint64 microseconds)
        (lambda d: d.update(batching={"request_timeout": float("inf")}), "batching.request_timeout"),
        (lambda d: d.update(batching={"request_timeout": 1e303}), "batching.request_timeout"),
        (lambda d: d.update(batching={"max_queue_delay": float("nan")}), "batching.max_queue_delay"),
        (lambda d: d["preprocessing"].update(resize="letterbox", crop_size={"height": 4, "width": 4}), "crop_size"),
        (lambda d: d.update(task="detection") or d["preprocessing"].update(resize="center_crop"), "no crop"),
    ],
)
def test_invalid_manifest_names_file_and_field(tmp_path, edit, field: str) -> None:
    _, path = broken_repository(tmp_path, edit)
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    assert str(path) in str(caught.value) and field in str(caught.value)


def test_server_with_a_bad_manifest_does_not_start(tmp_path) -> None:
    repo, path = broken_repository(tmp_path, lambda d: d["preprocessing"].pop("std"))
    result = run_server({"PATCHSERVE_MODEL_REPOSITORY": str(repo)})
    assert result.returncode == 2
    assert str(path) in result.stderr and "preprocessing.std" in result.stderr


def test_the_manifest_field_defaults_to_one_class_token_and_needs_exactly_one() -> None:
    spec = AttentionSpec.model_validate({"output": "attentions", "grid": {"height": 2, "width": 2}})
    assert spec.prefix_tokens == ["class"]
    distilled = AttentionSpec(output="a", grid={"height": 2, "width": 2}, prefix_tokens=["class", "distillation"])
    assert distilled.prefix_tokens == ["class", "distillation"]
    for bad in (["register"], ["class", "class"], [], ["class", "cls"]):
        with pytest.raises(ValidationError):
            AttentionSpec(output="a", grid={"height": 2, "width": 2}, prefix_tokens=bad)


def test_attention_field_is_optional_and_checked() -> None:
    data = json.loads((MODEL_REPOSITORY / "vit-digits" / "1" / "model.json").read_text())
    assert Manifest.model_validate(data).attention is None  # manifests written before it still load
    data["attention"] = {"output": "attentions", "grid": {"height": 4, "width": 4}}
    with pytest.raises(ValueError, match="not one of outputs"):
        Manifest.model_validate(data)
    data["outputs"] = [*data["outputs"], "attentions"]
    assert Manifest.model_validate(data).attention.grid.width == 4
