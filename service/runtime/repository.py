"""The model repository: ``<root>/<name>/<version>/{model.onnx, model.json}``.

:class:`ModelRepository` is the routing table: the versions serving now, by name then version.
A request's model name is a dictionary key, never a path, so nothing a client sends can reach
outside the repository. What is served changes while the server runs (:mod:`service.runtime.model_control`):
a request holds its version with :meth:`ModelRepository.use` from lookup to answer, so a version
taken out of the table finishes every request that reached it before its sessions are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service import tasks
from service.batching.arrays import blank_arguments
from service.batching.batcher import Batcher
from service.core.errors import ModelNotFound, RepositoryError
from service.imaging.preprocess import Preprocessor
from service.runtime.cpus import ThreadPlan
from service.runtime.manifest import Manifest
from service.runtime.sessions import OrtRunner
from service.runtime.tuning import TuneResult

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# A version is a folder name of at most 9 digits (as /v1's ?version= pattern says): a longer
# string is no version here, and is never given to int(), whose digit limit (CVE-2020-10735)
# raises ValueError on 4,300 digits and more.
VERSION_PATTERN = re.compile(r"[0-9]{1,9}")  # matched with fullmatch


@dataclass
class ModelVersion:
    """One loaded model version: its manifest, session, preprocessing and batcher."""

    name: str
    version: int
    path: Path
    manifest: Manifest
    runner: OrtRunner
    preprocessor: Preprocessor
    batcher: Batcher
    warmed_up: bool = False
    warm_up_seconds: float | None = None  # how long warm_up took (every bucket at every batch size)
    instances: list[OrtRunner] = field(default_factory=list)  # every session the batcher feeds; runner is the first
    wide: OrtRunner | None = None  # the session with every core for a lone request (None: none)
    threads: ThreadPlan | None = None  # the sessions' threads and why (None: given by the caller as plain values)
    tuning: TuneResult | None = None  # the auto-tuner's curve and choice (None: not tuned)
    tuning_note: str = "off"  # why it was or was not tuned
    users: int = 0  # requests holding this version (ModelRepository.use), queued and in flight included
    retiring: bool = False  # out of the routing table: finishing its requests, then released
    released: bool = False  # sessions and buffers let go
    _unused: asyncio.Event | None = field(default=None, repr=False)  # set when retiring and users reaches 0

    @property
    def ready(self) -> bool:
        """Loaded, on the provider asked for, warmed up, and its batching loop alive."""
        return self.runner.providers.ok and self.warmed_up and self.batcher.running

    @property
    def not_ready_reason(self) -> str:
        """Why ``ready`` is False ("" when it is True)."""
        if not self.runner.providers.ok:
            return self.runner.providers.reason
        if not self.warmed_up:
            return "not warmed up yet"
        if not self.batcher.running:
            return "its batching loop has stopped"
        return ""

    def warm_up(self) -> None:
        """Run the graph once per batch size it will see, so first requests pay no set-up cost.

        Blocking; called from a worker thread before the server reports ready.
        """
        started = time.perf_counter()
        c, h, w = self.preprocessor.output_shape
        buckets = self.preprocessor.spec.buckets
        shapes = [(b.height, b.width) for b in buckets] if buckets else [(h, w)]
        runs = [(runner, self.batcher.config.max_batch_size) for runner in self.instances or [self.runner]]
        if self.wide is not None:  # it only ever runs a batch of one
            runs.append((self.wide, 1))
        for runner, largest in runs:
            for height, width in shapes:  # every bucket, at every batch size (issue 18: no first-run cost)
                for batch_size in range(1, largest + 1):
                    runner.run(*blank_arguments((c, height, width), batch_size, bool(buckets)))
        self.warm_up_seconds = time.perf_counter() - started
        log.info(
            "%s/%s warmed up in %.2f s (%d shape(s) x batch 1-%d)",
            self.name,
            self.version,
            self.warm_up_seconds,
            len(shapes),
            self.batcher.config.max_batch_size,
        )
        self.warmed_up = True

    async def until_unused(self) -> None:
        """Return once no request holds this version (it must be out of the routing table: ``retiring``)."""
        assert self.retiring, "only a retiring version stops gaining users"
        if self.users == 0:
            return
        if self._unused is None:
            self._unused = asyncio.Event()
        await self._unused.wait()

    def _let_go(self) -> None:
        self.users -= 1
        if self.users == 0 and self._unused is not None:
            self._unused.set()

    async def release(self) -> None:
        """Stop the batcher (anything still queued gets 503) and let go of every session and buffer.

        Called once the version is out of the routing table and unused. The sessions' memory
        (ONNX Runtime's arenas, the graph's weights) is freed when the last reference goes;
        ``malloc_trim`` then hands glibc's free pages back, so the process's RSS falls.
        """
        await self.batcher.stop()
        self.batcher.release()
        for runner in [*(self.instances or [self.runner]), *([self.wide] if self.wide else [])]:
            runner.close()
        self.instances, self.wide = [], None
        self.released = True
        gc.collect()
        _trim_malloc()

    def describe(self) -> dict[str, Any]:
        """The JSON description ``GET /v1/models`` shows for this version."""
        spec = self.manifest.preprocessing
        return {
            "version": str(self.version),
            "task": self.manifest.task,
            "serves": [task.verb for task in tasks.served_tasks(self.manifest)],  # POST /v1/models/{name}/{verb}
            "input": {
                "name": self.manifest.input.name,
                "shape": self.manifest.input.shape,
                "height": self.manifest.input.shape[2],  # an int, or a name where any size is taken
                "width": self.manifest.input.shape[3],
                "color_mode": spec.color_mode,
            },
            # what a client of the raw-tensor /v2 routes must do to an image itself
            "preprocessing": spec.model_dump(mode="json", exclude_none=True),
            "labels_count": len(self.manifest.labels),
            "provider": self.runner.providers.primary,
            "providers": self.runner.providers.in_use,
            "batching": dataclasses.asdict(self.batcher.config),  # the effective values, manifest overrides applied
            "instances": self.batcher.instances,
            "threads": self._describe_threads(),
            "autotune": self._describe_tuning(),
            "warm_up_seconds": self.warm_up_seconds,
            "ready": self.ready,
            "metrics": self.manifest.provenance.metrics,
        }

    def _describe_threads(self) -> dict[str, Any] | None:
        if self.threads is None:
            return None
        t = self.threads
        return {
            "instances": t.instances,
            "intra_op_threads": t.intra_op_threads,
            "wide_session_threads": t.wide_threads,  # 0: no wide session
            "wide_session_batches": self.batcher.wide_batches,
            "spinning": t.spinning,
            "decode_threads": t.decode_threads,
            "usable_cores": t.cores.cores,
            "cores": t.cores.describe(),
            "forced": sorted(t.forced),
            "reason": t.reason,
        }

    def _describe_tuning(self) -> dict[str, Any]:
        if self.tuning is None:
            return {"source": self.tuning_note}
        t = self.tuning
        return {
            "source": t.source,
            "note": self.tuning_note,
            "chosen": {"instances": t.instances, "max_batch_size": t.max_batch_size},
            "curve": [
                {
                    "instances": p.instances,
                    "batch_size": p.batch_size,
                    "images_per_s": p.images_per_s,
                    "low": p.low,
                    "high": p.high,
                }
                for p in t.points
            ],
            "seconds": round(t.seconds, 3),
            "foreign_cores": round(t.foreign_cores, 3),
            "measured_at": t.measured_at,
            "cache_file": t.cache_file,
        }


def _trim_malloc() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim(0)``; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class ModelRepository:
    """The versions serving now, by name then version (every one ready: a version enters once warmed up)."""

    root: Path
    models: dict[str, dict[int, ModelVersion]] = field(default_factory=dict)

    @contextlib.contextmanager
    def use(self, name: str, version: str | None = None) -> Iterator[ModelVersion]:
        """Hold the requested version (see :meth:`get`) for the block: it is not released meanwhile.

        Raises:
            ModelNotFound: no such model or version (404).
        """
        model = self.get(name, version)
        model.users += 1
        try:
            yield model
        finally:
            model._let_go()

    def add(self, model: ModelVersion) -> ModelVersion | None:
        """Route ``model`` (ready, its batcher started); returns the version it replaced (same number), if any."""
        previous = self.models.setdefault(model.name, {}).get(model.version)
        self.models[model.name][model.version] = model
        return previous

    def remove(self, name: str, version: int) -> ModelVersion:
        """Take a version out of the routing table: new requests no longer reach it (it is ``retiring``)."""
        model = self.models[name].pop(version)
        if not self.models[name]:
            del self.models[name]
        model.retiring = True
        return model

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The requested version, or the numerically highest one.

        Raises:
            ModelNotFound: no such model or version (404).
        """
        versions = self.models.get(name) if NAME_PATTERN.match(name) else None
        if not versions:
            raise ModelNotFound(f"no model named {name!r}; GET /v1/models lists them")
        if version is None:
            return versions[max(versions)]
        if not VERSION_PATTERN.fullmatch(version) or int(version) not in versions:
            shown = version if len(version) <= 40 else version[:40] + f"... ({len(version)} characters)"
            if VERSION_PATTERN.fullmatch(version) and (self.root / name / str(int(version)) / "model.onnx").is_file():
                raise ModelNotFound(  # (a folder of the repository that this worker does not route)
                    f"model {name!r} version {int(version)} is in the repository but not served: the model's "
                    "version_policy (its config.json, or one given with a load request) leaves it out, or it failed "
                    f"to load (listed under not_serving) or is still loading; GET /v1/models/{name} shows which. "
                    f"Served: {sorted(versions)}"
                )
            raise ModelNotFound(f"model {name!r} has no version {shown!r}; it has {sorted(versions)}")
        return versions[int(version)]

    def all(self) -> list[ModelVersion]:
        """Every loaded version, sorted by name then version."""
        return [self.models[n][v] for n in sorted(self.models) for v in sorted(self.models[n])]


def discover(root: Path) -> list[tuple[str, int, Path]]:
    """The (name, version, folder) of every ``<root>/<name>/<version>/`` with a model.onnx.

    Folders whose names start with a dot are skipped (``.2.partial``: a version being written,
    to be renamed to ``2`` when complete).

    Raises:
        RepositoryError: the root is missing, a folder's name is not a valid model
            name or version, or a folder cannot be read.
    """
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} does not exist or is not a folder")
    found = []
    try:
        for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not NAME_PATTERN.match(model_dir.name):
                raise RepositoryError(f"{model_dir}: not a valid model name (letters, digits, _ . -)")
            for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if not VERSION_PATTERN.fullmatch(version_dir.name):
                    raise RepositoryError(f"{version_dir}: a version folder must be a number of at most 9 digits")
                if (version_dir / "model.onnx").is_file():
                    found.append((model_dir.name, int(version_dir.name), version_dir))
    except OSError as exc:  # a folder this user may not read: say which, as for a bad name (was a traceback)
        raise RepositoryError(f"{exc.filename or root}: cannot be read ({exc.strerror or exc})") from None
    if not found:
        raise RepositoryError(f"model repository {root} holds no <name>/<version>/model.onnx")
    return found
