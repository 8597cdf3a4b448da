"""Model names and versions from a request never reach the filesystem.

A model planted beside the repository, where ``../`` would lead, is never served, and no
request opens or lists a model file, inside the repository or out: names and versions are
dictionary keys matched against what start-up found on disk.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import MODEL_REPOSITORY, ROOT, running_app

pytestmark = pytest.mark.anyio
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
HOSTILE_NAMES = [
    "..",
    "...",
    "..%2Fplanted",
    "%2e%2e%2Fplanted",
    "..%5Cplanted",
    "%2Ftmp%2Fplanted",
    "planted%00",
    "vit-digits%2F..%2F..%2Fplanted",
    "~",
    "%7E%2Fplanted",
    "." * 200,
    "a" * 300,
]
HOSTILE_VERSIONS = ["../1", "..%2F1", "1%2F..", "-1", "1.0", "0x1", "1e0", " 1", "１", "9" * 12]

# Filesystem audit events (PEP 578) a traversal would need to read a model.
_FS_EVENTS = {"open", "os.listdir", "os.scandir", "os.walk", "glob.glob", "pathlib.Path.glob", "shutil.copyfile"}
_recording: list[tuple[str, tuple]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _recording is not None and event in _FS_EVENTS:
        _recording.append((event, args))


sys.addaudithook(_audit)  # hooks cannot be removed; this one records only while _recording is set


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """tmp/repo/vit-digits/1 (the real model) and tmp/planted/1, a model outside the repository."""
    root = tmp_path / "repo"
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", root / "vit-digits")
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", tmp_path / "planted")
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", tmp_path / "repo-planted")
    return root


async def test_names_and_versions_never_reach_the_filesystem(repository: Path) -> None:
    global _recording
    async with running_app(model_repository=repository) as client:
        served = await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7})
        assert served.status_code == 200  # the same files inside the repository are served
        _recording = []
        try:
            statuses = {}
            for name in HOSTILE_NAMES:
                statuses[name] = (
                    (await client.post(f"/v1/models/{name}/classify", files={"image": DIGIT_7})).status_code,
                    (await client.get(f"/v1/models/{name}")).status_code,
                )
            for version in HOSTILE_VERSIONS:
                url = f"/v1/models/vit-digits/classify?version={version}"
                statuses[version] = ((await client.post(url, files={"image": DIGIT_7})).status_code,)
            events = list(_recording)
        finally:
            _recording = None
    assert all(code == 404 for name in HOSTILE_NAMES for code in statuses[name]), statuses
    assert {v: statuses[v] for v in HOSTILE_VERSIONS} == {v: (422,) for v in HOSTILE_VERSIONS}
    # Nothing under tmp (the repository and the planted models beside it) was opened or listed.
    # (Python may read its own source files, e.g. for a traceback; those are not model files.)
    assert [e for e in events if str(repository.parent) in str(e[1]) or "planted" in str(e[1])] == []


async def test_the_listing_shows_only_what_is_inside_the_repository(repository: Path) -> None:
    async with running_app(model_repository=repository) as client:
        listing = (await client.get("/v1/models")).json()
    assert [m["name"] for m in listing["models"]] == ["vit-digits"]


def test_a_folder_that_cannot_be_read_stops_the_start_naming_it(tmp_path: Path, monkeypatch) -> None:
    # a tester's: a version folder its user may not read (chmod 000, no CAP_DAC_OVERRIDE) gave a traceback.
    # This runs as root here, which reads anything: the kernel's refusal is played by the stat call.
    from service.core.errors import RepositoryError
    from service.runtime.repository import discover

    shutil.copytree(MODEL_REPOSITORY / "vit-digits" / "1", tmp_path / "vit-digits" / "3")
    blocked = tmp_path / "vit-digits" / "3" / "model.onnx"
    is_file = Path.is_file

    def refuse(path: Path) -> bool:
        if path == blocked:
            raise PermissionError(13, "Permission denied", str(path))
        return is_file(path)

    monkeypatch.setattr(Path, "is_file", refuse)
    with pytest.raises(RepositoryError, match=r"vit-digits/3/model.onnx: cannot be read \(Permission denied\)"):
        discover(tmp_path)
