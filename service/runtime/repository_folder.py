"""The repository folder as model control sees it: each model's version folders, complete or not.

A version folder is complete once it holds ``model.json`` and ``model.onnx``; its
:data:`Fingerprint` (both files' sizes and modification times) tells the poller whether a copy is
still being written (:mod:`service.runtime.model_control`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.runtime.repository import NAME_PATTERN, VERSION_PATTERN

Fingerprint = tuple[int, int, int, int]  # model.json and model.onnx: (size, mtime_ns) each


def fingerprint(folder: Path) -> Fingerprint | None:
    """The sizes and modification times of ``folder``'s model.json and model.onnx; None while either is missing."""
    try:
        manifest, graph = (folder / "model.json").stat(), (folder / "model.onnx").stat()
    except OSError:
        return None
    return manifest.st_size, manifest.st_mtime_ns, graph.st_size, graph.st_mtime_ns


@dataclass
class Found:
    """One version folder: where it is, and its files' fingerprint (None: incomplete)."""

    folder: Path
    fingerprint: Fingerprint | None


def scan(root: Path, names: set[str] | None, warn: Callable[[str], None]) -> dict[str, dict[int, Found]]:
    """The version folders under ``root`` (of ``names`` only, if given), complete or not, by model and version.

    Folders whose names start with a dot are skipped; an invalid model or version name is
    skipped with ``warn(message)``.

    Raises:
        OSError: the root or a model folder could not be listed (a folder that vanished while it
            was scanned, an unmounted volume).
    """
    found: dict[str, dict[int, Found]] = {}
    for model_dir in sorted(root.iterdir()):
        name = model_dir.name
        if not model_dir.is_dir() or name.startswith(".") or (names is not None and name not in names):
            continue
        if not NAME_PATTERN.match(name):
            warn(f"{model_dir}: not a valid model name (letters, digits, _ . -); ignored")
            continue
        versions = found.setdefault(name, {})
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not VERSION_PATTERN.fullmatch(version_dir.name):
                warn(f"{version_dir}: a version folder must be a number of at most 9 digits; ignored")
                continue
            versions[int(version_dir.name)] = Found(version_dir, fingerprint(version_dir))
    return found
