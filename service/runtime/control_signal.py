"""The load and unload API with several workers: one signal, a shared file, that every worker follows.

A repository API request reaches one worker process. That worker writes the change (model,
load or unload, the load's version policy) into ``model-control.json`` in the folder the workers
share (``PROMETHEUS_MULTIPROC_DIR``, created and wiped at every start by :mod:`service.process.serve`),
under a file lock, with a generation number per model, and applies it itself before it answers.
Every worker checks the file every :data:`CHECK_SECONDS` and applies each model's change it has
not applied yet, as if the request had reached it; a worker that starts (or restarts) later
applies them all once its models are loaded. Until a worker has applied a change, it serves what
it served before: the window is one check interval plus the time one load takes
(docs/model-control.md).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from service.runtime.version_policy import VersionPolicy

log = logging.getLogger(__name__)

FILE_NAME = "model-control.json"
CHECK_SECONDS = 0.5


class ControlSignal:
    """The shared file of API changes, and the generation of each model's change this worker has applied."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied: dict[str, int] = {}
        self._stamp: tuple[int, int, int] | None = None

    def read(self) -> dict[str, dict[str, Any]]:
        """model -> {"generation", "action": "load" | "unload", "policy": dict | None}; {} without a file."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def publish(self, name: str, action: str, policy: VersionPolicy | None) -> None:
        """Record a change for every worker (this one marks it applied: it applies it itself)."""
        with self.path.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            changes = self.read()
            generation = changes.get(name, {}).get("generation", 0) + 1
            changes[name] = {
                "generation": generation,
                "action": action,
                "policy": policy.describe() if policy is not None else None,
            }
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(changes, indent=2) + "\n")
            partial.replace(self.path)
        self.applied[name] = generation

    def pending(self) -> list[tuple[str, str, VersionPolicy | None]]:
        """The changes not applied here yet, as (model, action, policy); marks them applied.

        Only reads the file when its inode, size or modification time changed since the last
        call. The inode is what tells two publications within one tick of the file system's
        clock apart: each is a new file renamed over the last, which is still there when the
        next is created, so the two never share an inode number.
        """
        try:
            stat = self.path.stat()
        except OSError:
            return []
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if stamp == self._stamp:
            return []
        self._stamp = stamp
        changes = []
        for name, change in sorted(self.read().items()):
            generation = change.get("generation", 0)
            if generation <= self.applied.get(name, 0):
                continue
            self.applied[name] = generation
            policy = VersionPolicy.model_validate(change["policy"]) if change.get("policy") else None
            changes.append((name, change.get("action", "load"), policy))
        return changes


async def follow(state: Any, loading: asyncio.Task[None], signal: ControlSignal) -> None:
    """Apply the other workers' API changes until cancelled or draining (a task of each worker)."""
    await asyncio.shield(loading)
    if state.repository is None:
        return
    while not state.draining:
        for name, action, policy in signal.pending():
            log.info("model %s: %s requested through another worker; applying it here", name, action)
            try:
                if action == "unload":
                    await state.control.unload(name, signal=False)
                else:
                    await state.control.load(name, policy, signal=False)
            except Exception as exc:  # a failed load is also counted and shown by the control itself
                log.warning("model %s: the %s requested through another worker failed here: %s", name, action, exc)
        await asyncio.sleep(CHECK_SECONDS)
