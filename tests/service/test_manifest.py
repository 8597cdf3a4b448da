"""Manifest and settings validation: bad values stop start-up with a message that names them."""

from __future__ import annotations

import json
import shutil

import pytest

from service.core.settings import load_settings, unknown_variables
from service.runtime.manifest import ManifestError, load_manifest
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


def test_server_with_a_bad_setting_names_the_variable() -> None:
    result = run_server({"PATCHSERVE_MAX_BATCH_SIZE": "0"})
    assert result.returncode == 2
    assert "PATCHSERVE_MAX_BATCH_SIZE" in result.stderr


def test_settings_read_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATCHSERVE_PORT", "9001")
    monkeypatch.setenv("PATCHSERVE_API_KEYS", "a, b")
    monkeypatch.setenv("PATCHSERVE_DEVICE", "cpu")
    settings = load_settings()
    assert settings.port == 9001 and settings.api_keys == ["a", "b"] and settings.device == "cpu"
    monkeypatch.setenv("PATCHSERVE_DEVICE", "tpu")
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and "PATCHSERVE_DEVICE" in capsys.readouterr().err


@pytest.mark.parametrize(
    "variable", ["PATCHSERVE_REQUEST_TIMEOUT", "PATCHSERVE_BODY_TIMEOUT", "PATCHSERVE_SEND_TIMEOUT"]
)
@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
def test_a_timeout_that_is_not_finite_stops_the_start(monkeypatch, capsys, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        load_settings()
    assert stopped.value.code == 2 and variable in capsys.readouterr().err


def test_an_unknown_patchserve_variable_is_named_with_the_setting_it_resembles() -> None:
    environ = {"PATCHSERVE_MAX_BATCH": "8", "PATCHSERVE_PORT": "9000", "PATCHSERVE_ZZZ": "1", "HOME": "/root"}
    assert unknown_variables(environ) == [
        "PATCHSERVE_MAX_BATCH: not a setting, ignored (did you mean PATCHSERVE_MAX_BATCH_SIZE?)",
        "PATCHSERVE_ZZZ: not a setting, ignored",
    ]
