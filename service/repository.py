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
from service.cpus import ThreadPlan
from service.errors import ModelNotFound, RepositoryError
from service.manifest import Manifest, ManifestError, load_manifest
from service.preprocess import Preprocessor
from service.runtime import CudaOptions, OrtRunner
from service.tuning import Tuner, TuneResult

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
    instances: list[OrtRunner] = field(default_factory=list)  # every session the batcher feeds; runner is the first
    threads: ThreadPlan | None = None  # the sessions' threads and why (None: given by the caller as plain values)
    tuning: TuneResult | None = None  # the auto-tuner's curve and choice (None: not tuned)
    tuning_note: str = "off"  # why it was or was not tuned

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
            # what a client of the raw-tensor /v2 routes must do to an image itself
            "preprocessing": spec.model_dump(mode="json", exclude_none=True),
            "labels_count": len(self.manifest.labels),
            "provider": self.runner.providers.primary,
            "providers": self.runner.providers.in_use,
            "batching": dataclasses.asdict(self.batcher.config),  # the effective values, manifest overrides applied
            "instances": self.batcher.instances,
            "threads": self._describe_threads(),
            "autotune": self._describe_tuning(),
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
                {"instances": p.instances, "batch_size": p.batch_size, "images_per_s": p.images_per_s} for p in t.points
            ],
            "seconds": round(t.seconds, 3),
            "foreign_cores": round(t.foreign_cores, 3),
            "measured_at": t.measured_at,
            "cache_file": t.cache_file,
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
        if not VERSION_PATTERN.fullmatch(version) or int(version) not in versions:
            shown = version if len(version) <= 40 else version[:40] + f"... ({len(version)} characters)"
            raise ModelNotFound(f"model {name!r} has no version {shown!r}; it has {sorted(versions)}")
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
            if not VERSION_PATTERN.fullmatch(version_dir.name):
                raise RepositoryError(f"{version_dir}: a version folder must be a number of at most 9 digits")
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
    threads: ThreadPlan | None = None,
    tuner: Tuner | None = None,
    batch_size_fixed: bool = False,
) -> ModelRepository:
    """Load every model version under ``root`` (sessions created, batchers not started).

    Each version gets ``instances`` ONNX Runtime sessions, all fed by its one batcher; the
    session options are :class:`OrtRunner`'s. With ``threads`` (:func:`service.cpus.plan_threads`)
    the instances, intra-op threads and spinning come from that plan instead of the plain values.
    With ``tuner`` each version's instance count and ``max_batch_size`` are measured (or read from
    the tuner's cache) first, except what is fixed: ``max_batch_size`` by the manifest's
    ``batching`` section or, with ``batch_size_fixed``, by ``batching``; the instance count by
    the plan (a setting forced it).

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
        preprocessor = Preprocessor(manifest.preprocessing)
        overrides = manifest.batching.model_dump() if manifest.batching is not None else {}
        config = batching.override(**overrides)

        def make_runner(intra: int, spinning: bool, folder: Path = folder) -> OrtRunner:
            return OrtRunner(
                folder / "model.onnx",
                device=device,
                intra_op_threads=intra,
                inter_op_threads=inter_op_threads,
                intra_op_spinning=spinning,
                io_binding=io_binding,
                cuda=cuda,
            )

        plan, tuned, note = threads, None, "off"
        if tuner is not None and plan is not None:
            fixed_batch = overrides.get("max_batch_size") or (batching.max_batch_size if batch_size_fixed else None)
            fixed_instances = plan.instances if "instances" in plan.forced else None
            tuned = tuner.run(
                name,
                version,
                folder / "model.onnx",
                preprocessor.output_shape,
                manifest.input.dtype,
                make_runner=make_runner,
                threads_for=lambda n, plan=plan: (
                    plan.with_instances(n).intra_op_threads,
                    plan.with_instances(n).spinning,
                ),
                cores=plan.cores.cores,
                share=plan.share,
                fixed_instances=fixed_instances,
                fixed_batch_size=fixed_batch,
            )
            note = _tuning_note(tuned, overrides, batch_size_fixed, fixed_instances)
            if tuned is not None:
                plan = plan.with_instances(tuned.instances)
                config = config.override(max_batch_size=fixed_batch or tuned.max_batch_size)
        if plan is not None:
            runners = [make_runner(plan.intra_op_threads, plan.spinning) for _ in range(plan.instances)]
        else:
            runners = [make_runner(intra_op_threads, intra_op_spinning) for _ in range(instances)]
        runner = runners[0]
        batcher = Batcher([r.run for r in runners], config, model=name, version=str(version))
        repository.models.setdefault(name, {})[version] = ModelVersion(
            name, version, folder, manifest, runner, preprocessor, batcher, instances=runners,
            threads=plan, tuning=tuned, tuning_note=note,
        )  # fmt: skip
        log.info(
            "model %s version %d: %s on %s; %s; max_batch_size %d",
            name, version, manifest.task, runner.providers.primary,
            plan.reason if plan is not None else f"{len(runners)} instance(s)", config.max_batch_size,
        )  # fmt: skip
    return repository


def _tuning_note(tuned: TuneResult | None, overrides: dict, batch_size_fixed: bool, fixed_instances: int | None) -> str:
    """Why the tuner chose what it did not (a fixed value), in words."""
    fixed = []
    if overrides.get("max_batch_size"):
        fixed.append("max_batch_size from the manifest's batching section")
    elif batch_size_fixed:
        fixed.append("max_batch_size set (PATCHSERVE_MAX_BATCH_SIZE)")
    if fixed_instances is not None:
        fixed.append("instances set (PATCHSERVE_INSTANCES)")
    if tuned is None:
        return "not tuned: " + (" and ".join(fixed) if fixed else "the session did not get its provider")
    return "tuned" + (f"; kept {' and '.join(fixed)}" if fixed else "")
