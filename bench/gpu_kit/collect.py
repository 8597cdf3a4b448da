"""The GPU machine's side of the kit: take in the parts carried so far, cut out and check what is complete, install.

Standard library only: it runs before anything is installed (``bench/gpu_kit/kit.py`` says
what the kit is; ``docs/gpu.md`` gives the sequence of calls).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import BinaryIO

from bench.gpu_kit.kit import KitError, pip, sha256

log = logging.getLogger(__name__)


def _read_range(parts_dir: Path, manifest: dict, offset: int, size: int, sink: BinaryIO) -> None:
    """Copy stream bytes [offset, offset + size) from the part files in ``parts_dir`` to ``sink``."""
    start = 0
    for part in manifest["parts"]:
        end = start + part["size"]
        if end > offset and start < offset + size:
            with (parts_dir / part["file"]).open("rb") as f:
                f.seek(max(offset, start) - start)
                todo = min(offset + size, end) - max(offset, start)
                while todo:
                    chunk = f.read(min(todo, 2**20))
                    sink.write(chunk)
                    todo -= len(chunk)
        start = end


def _parts_covering(manifest: dict, offset: int, size: int) -> list[str]:
    names, start = [], 0
    for part in manifest["parts"]:
        end = start + part["size"]
        if end > offset and start < offset + size:
            names.append(part["name"])
        start = end
    return names


def collect(carried: Path, home: Path) -> dict:
    """Take in the parts carried to this call, cut out every file now complete, install complete groups.

    Args:
        carried: the folder the parts travel in (``.gpu-kit/<target>/parts``): ``NN/kit.partNN``
            and ``NN/kit.json``, any subset of them.
        home: where the kit persists between calls (``/tmp/gpu-kit``): ``parts/``, ``files/``,
            ``site/`` (the ``serve`` group), ``site-ort/`` (ONNX Runtime).

    Returns:
        ``{"parts": {"have": [...], "missing": [...]}, "installed": [groups], "files": n}``.

    Raises:
        KitError: a carried part whose checksum is wrong, parts of two different kits, pip failing.
    """
    manifests = [json.loads(p.read_text()) for p in sorted(carried.glob("*/kit.json"))]
    kept = home / "kit.json"
    if kept.is_file():
        manifests.append(json.loads(kept.read_text()))
    if not manifests:
        raise KitError(f"no kit.json under {carried} nor in {home}: carry a part folder (docs/gpu.md)")
    manifest = manifests[0]
    if any(m["stream_sha256"] != manifest["stream_sha256"] for m in manifests):
        if kept.is_file() and len(manifests) > 1:  # a new kit: forget the old one
            shutil.rmtree(home)
            manifests.pop()
        if any(m["stream_sha256"] != manifest["stream_sha256"] for m in manifests):
            raise KitError(f"the parts under {carried} come from different kits: rebuild and carry one")
    parts = home / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(manifest, indent=1) + "\n")
    have = []
    for part in manifest["parts"]:
        dest = parts / part["file"]
        if dest.is_file() and dest.stat().st_size == part["size"] and sha256(dest) == part["sha256"]:
            have.append(part["name"])
            continue
        source = carried / part["name"] / part["file"]
        if source.is_file():
            if sha256(source) != part["sha256"]:
                raise KitError(f"{source}: sha256 is not kit.json's {part['sha256']}: carry it again")
            shutil.copyfile(source, dest)
            log.info("took in part %s (%.1f MiB)", part["name"], part["size"] / 2**20)
            have.append(part["name"])
    files = home / "files"
    complete = 0
    for entry in manifest["files"]:
        dest = files / entry["path"]
        if dest.is_file() and dest.stat().st_size == entry["size"]:
            complete += 1
            continue
        if not set(_parts_covering(manifest, entry["offset"], entry["size"])) <= set(have):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")  # renamed once checked: a cut-off call leaves no bad file
        with partial.open("wb") as sink:
            _read_range(parts, manifest, entry["offset"], entry["size"], sink)
        if sha256(partial) != entry["sha256"]:
            partial.unlink()
            raise KitError(f"{entry['path']}: sha256 is not kit.json's: rebuild the kit")
        partial.rename(dest)
        complete += 1
    installed = [group for group in ("serve", "ort") if _install_group(manifest, home, group)]
    missing = [p["name"] for p in manifest["parts"] if p["name"] not in have]
    return {"parts": {"have": have, "missing": missing}, "installed": installed, "files": complete}


def site_dirs(home: Path) -> list[Path]:
    """The folders to put first on PYTHONPATH, ONNX Runtime's first so that it shadows the machine's."""
    return [home / "site-ort", home / "site"]


def _install_group(manifest: dict, home: Path, group: str) -> bool:
    """Install ``group``'s wheels once all have arrived; True when it is installed (now or earlier)."""
    target = home / ("site-ort" if group == "ort" else "site")
    marker = target / f".installed-{manifest['stream_sha256'][:16]}"
    if marker.is_file():
        return True
    files = home / "files"
    wanted = [f for f in manifest["files"] if f["group"] == group] + [{"path": f"{group}.txt", "size": None}]
    if not all((files / f["path"]).is_file() for f in wanted):
        return False
    shutil.rmtree(target, ignore_errors=True)
    if (files / f"{group}.txt").read_text().strip():
        pip(
            [
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--require-hashes",
                "--only-binary=:all:",
                "--find-links",
                str(files / "wheels"),
                "--target",
                str(target),
                "-r",
                str(files / f"{group}.txt"),
            ],
            offline=True,
        )
    target.mkdir(parents=True, exist_ok=True)
    marker.touch()
    log.info("installed the %s group into %s", group, target)
    return True
