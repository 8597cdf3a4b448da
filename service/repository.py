"""The model repository: ``<root>/<name>/<version>/{model.onnx, model.json}``.

Names and versions are matched against what was found on disk at start-up; a request's
model name is a dictionary key, never a path, so nothing a client sends can reach outside the
repository.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from service import tasks
from service.batching import Batcher, BatchingConfig
from service.errors import ModelNotFound, RepositoryError
from service.manifest import Manifest, ManifestError, load_manifest
from service.preprocess import Preprocessor
from service.runtime import CudaOptions, OrtRunner

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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
    instances: list[OrtRunner] = field(default_factory=list)  # every session the batcher feeds; runner is the first

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
        c, h, w = self.preprocessor.output_shape
        for runner in self.instances or [self.runner]:
            for batch_size in range(1, self.batcher.config.max_batch_size + 1):
                runner.run(np.zeros((batch_size, c, h, w), dtype=np.float32))
        self.warmed_up = True

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
            "labels_count": len(self.manifest.labels),
            "provider": self.runner.providers.primary,
            "providers": self.runner.providers.in_use,
            "batching": dataclasses.asdict(self.batcher.config),  # the effective values, manifest overrides applied
            "instances": self.batcher.instances,
            "ready": self.ready,
            "metrics": self.manifest.provenance.metrics,
        }


@dataclass
class ModelRepository:
    """Every model version found at start-up, by name then version."""

    root: Path
    models: dict[str, dict[int, ModelVersion]] = field(default_factory=dict)

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
        if not (version.isascii() and version.isdigit()) or int(version) not in versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; it has {sorted(versions)}")
        return versions[int(version)]

    def all(self) -> list[ModelVersion]:
        """Every loaded version, sorted by name then version."""
        return [self.models[n][v] for n in sorted(self.models) for v in sorted(self.models[n])]


def discover(root: Path) -> list[tuple[str, int, Path]]:
    """The (name, version, folder) of every ``<root>/<name>/<version>/`` with a model.onnx.

    Raises:
        RepositoryError: the root is missing, or a folder's name is not a valid model
            name or version.
    """
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} does not exist or is not a folder")
    found = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not NAME_PATTERN.match(model_dir.name):
            raise RepositoryError(f"{model_dir}: not a valid model name (letters, digits, _ . -)")
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            if not (version_dir.name.isascii() and version_dir.name.isdigit()):
                raise RepositoryError(f"{version_dir}: a version folder must be a number")
            if (version_dir / "model.onnx").is_file():
                found.append((model_dir.name, int(version_dir.name), version_dir))
    if not found:
        raise RepositoryError(f"model repository {root} holds no <name>/<version>/model.onnx")
    return found


def load_repository(
    root: Path,
    *,
    device: Literal["auto", "cuda", "cpu"],
    batching: BatchingConfig,
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    intra_op_spinning: bool = False,
    io_binding: bool = False,
    cuda: CudaOptions | None = None,
    instances: int = 1,
) -> ModelRepository:
    """Load every model version under ``root`` (sessions created, batchers not started).

    Each version gets ``instances`` ONNX Runtime sessions, all fed by its one batcher; the
    session options are :class:`OrtRunner`'s.

    Raises:
        RepositoryError: a missing or invalid manifest (naming the file and field), or a
            bad repository layout.
    """
    repository = ModelRepository(root)
    for name, version, folder in discover(root):
        try:
            manifest = load_manifest(folder / "model.json")
        except ManifestError as exc:
            raise RepositoryError(str(exc)) from None
        runners = [
            OrtRunner(
                folder / "model.onnx",
                device=device,
                intra_op_threads=intra_op_threads,
                inter_op_threads=inter_op_threads,
                intra_op_spinning=intra_op_spinning,
                io_binding=io_binding,
                cuda=cuda,
            )
            for _ in range(instances)
        ]
        runner = runners[0]
        overrides = manifest.batching.model_dump() if manifest.batching is not None else {}
        batcher = Batcher([r.run for r in runners], batching.override(**overrides), model=name, version=str(version))
        repository.models.setdefault(name, {})[version] = ModelVersion(
            name, version, folder, manifest, runner, Preprocessor(manifest.preprocessing), batcher, instances=runners
        )
        log.info("model %s version %d: %s on %s", name, version, manifest.task, runner.providers.primary)
    return repository
