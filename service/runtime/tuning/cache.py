"""The auto-tuner's cache: one JSON file per model file and machine, and the lock the workers share.

Keyed by the graph's SHA-256, the CPU or GPU identity, ONNX Runtime's version, the threads the
sessions get and the bounds (:func:`cache_key`), so a restart reads the result instead of
measuring again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from service.runtime.tuning.curve import TuneResult

log = logging.getLogger(__name__)

CACHE_VERSION = 1


def graph_digest(path: Path) -> str:
    """SHA-256 of the graph file, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _gpu_names() -> list[str]:
    """The NVIDIA GPUs' model names, from the driver's /proc files (no subprocess, no CUDA call)."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    names.append(line.split(":", 1)[1].strip())
    return names


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_identity(provider: str, cores: int, ort_version: str) -> dict[str, Any]:
    """What makes a measurement valid on this machine only: CPU model, usable cores, GPU, ORT, provider."""
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "gpus": _gpu_names() if provider.startswith("CUDA") else [],
        "onnxruntime": ort_version,
        "provider": provider,
    }


def cache_key(digest: str, identity: Mapping[str, object], request: Mapping[str, object]) -> str:
    """SHA-256 (hex) of the graph digest, the machine identity and what was asked (threads, bounds, shape)."""
    text = json.dumps({"v": CACHE_VERSION, "graph": digest, "machine": identity, "request": request}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/patchserve/tuning`` (``~/.cache/…``), or a folder in the temporary directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "patchserve" / "tuning"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"patchserve-tuning-{os.getuid()}"


class TuneCache:
    """One JSON file per cache key in ``folder``, and a lock file beside it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str, version: int, key: str) -> Path:
        return self.folder / f"{name}-{version}-{key[:20]}.json"

    def load(self, name: str, version: int, key: str, *, any_version: bool = False) -> TuneResult | None:
        """The cached result for ``key``, or None (missing, unreadable, or another key's).

        With ``any_version`` the result may have been cached under another model name or version
        (the key holds the graph's hash: the same graph gets the same result).
        """
        path = self.path(name, version, key)
        if any_version and not path.exists():
            path = next(iter(sorted(self.folder.glob(f"*-{key[:20]}.json"))), path)
        try:
            data = json.loads(path.read_text())
            result = TuneResult.from_dict(data)
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if result.key != key:
            return None
        result.source, result.cache_file = "cache", str(path)
        return result

    def store(self, name: str, version: int, result: TuneResult) -> str:
        """Write ``result`` (atomically); return the file, or "" when it cannot be written."""
        path = self.path(name, version, result.key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({**result.to_dict(), "cache_file": str(path)}, indent=2) + "\n")
            partial.replace(path)
        except OSError as exc:
            log.warning("auto-tune: cannot cache the result in %s: %s", self.folder, exc)
            return ""
        return str(path)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold an exclusive lock on ``key`` (other worker processes wait); no lock if it cannot be made."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = (self.folder / f".{key[:20]}.lock").open("a")
        except OSError as exc:
            log.warning("auto-tune: no lock in %s (%s): each worker measures on its own", self.folder, exc)
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
