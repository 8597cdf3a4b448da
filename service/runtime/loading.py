"""Loading one model version: manifest, sessions, checks against the graph, tuning, warm-up.

:class:`Loader` holds the plain values every version is loaded with (device, batching defaults,
threads, the auto-tuner) and :meth:`Loader.load` turns one ``<name>/<version>/`` folder into a
:class:`~service.runtime.repository.ModelVersion` whose batcher is not started yet. It is blocking and
runs in a worker thread, at start-up for every version and later for each version published
while the server serves (:mod:`service.runtime.version_swaps`).

While other models serve, the auto-tuner never measures (a measurement taken while the CPU is
shared with live traffic would be wrong, and would slow that traffic): a live load takes the
tuner's cached result for this graph if there is one, else the choice of the version of the same
model that is serving now, else the batching settings as given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.batching.arrays import blank_arguments
from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig
from service.core.errors import RepositoryError
from service.imaging.preprocess import Preprocessor
from service.runtime.cpus import ThreadPlan
from service.runtime.manifest import Manifest, ManifestError, load_manifest
from service.runtime.repository import ModelVersion
from service.runtime.sessions import CudaOptions, OrtRunner
from service.runtime.tuning import Tuner, TuneResult
from service.runtime.tuning.measure import lone_run_seconds, wide_pays

log = logging.getLogger(__name__)


def check_graph(manifest: Manifest, runner: OrtRunner, folder: Path) -> None:
    """Refuse a graph that does not match its manifest: input name, fixed input dims, output names.

    Raises:
        RepositoryError: naming the folder, what the manifest says and what the graph has.
    """
    graph_input = runner.session.get_inputs()[0]
    if graph_input.name != manifest.input.name:
        raise RepositoryError(
            f"{folder}: the graph's input is {graph_input.name!r}, the manifest's input.name {manifest.input.name!r}"
        )
    shape = list(graph_input.shape)
    if len(shape) != 4 or any(
        isinstance(g, int) and isinstance(m, int) and g != m
        for g, m in zip(shape[1:], manifest.input.shape[1:], strict=True)
    ):
        raise RepositoryError(
            f"{folder}: the graph's input {graph_input.name!r} has shape {shape}, the manifest's input.shape "
            f"{manifest.input.shape}"
        )
    inputs = [i.name for i in runner.session.get_inputs()]
    expected = [manifest.input.name] + ([manifest.pixel_mask] if manifest.pixel_mask else [])
    if inputs != expected:
        raise RepositoryError(
            f"{folder}: the graph's inputs are {inputs}, the manifest's input.name and pixel_mask say {expected}"
        )
    missing = [name for name in manifest.outputs if name not in runner.output_names]
    if missing:
        raise RepositoryError(
            f"{folder}: the manifest's outputs {missing} are not in the graph ({runner.output_names})"
        )


def _tuning_note(
    tuned: TuneResult | None,
    overrides: dict[str, Any],
    batch_size_fixed: bool,
    fixed_instances: int | None,
    instances_set: bool = True,
) -> str:
    """Why the tuner chose what it did not (a fixed value), in words."""
    fixed = []
    if overrides.get("max_batch_size"):
        fixed.append("max_batch_size from the manifest's batching section")
    elif batch_size_fixed:
        fixed.append("max_batch_size set (PATCHSERVE_MAX_BATCH_SIZE)")
    if fixed_instances is not None:
        by = "set (PATCHSERVE_INSTANCES)" if instances_set else "planned beside a wide session"
        fixed.append(f"instances {by}")
    if tuned is None:
        return "not tuned: " + (" and ".join(fixed) if fixed else "the session did not get its provider")
    return "tuned" + (f"; kept {' and '.join(fixed)}" if fixed else "")


@dataclass(frozen=True)
class Loader:
    """The values every model version is loaded with (see :func:`service.runtime.repository.load_repository`).

    With ``threads`` (:func:`service.runtime.cpus.plan_threads`) the instances, intra-op threads and spinning
    come from that plan instead of the plain values. With ``tuner`` each version's instance count and
    ``max_batch_size`` are measured (or read from the tuner's cache) first, except what is fixed:
    ``max_batch_size`` by the manifest's ``batching`` section or, with ``batch_size_fixed``, by
    ``batching``; the instance count by the plan (a setting forced it). ``scaled_decode``: JPEGs and WebPs
    may be decoded at a reduced scale for the model's input (:attr:`Preprocessor.draft_size`).
    """

    device: Literal["auto", "cuda", "cpu"]
    batching: BatchingConfig
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    intra_op_spinning: bool = False
    io_binding: bool = False
    cuda: CudaOptions | None = None
    instances: int = 1
    threads: ThreadPlan | None = None
    tuner: Tuner | None = None
    batch_size_fixed: bool = False
    scaled_decode: bool = True
    lone_timer: Callable[..., tuple[float, float]] = lone_run_seconds  # (tests inject one)

    def load(
        self, name: str, version: int, folder: Path, *, live: bool = False, serving: ModelVersion | None = None
    ) -> ModelVersion:
        """Load ``folder`` (``<name>/<version>/``): sessions created and checked, batcher not started.

        Blocking (seconds); call it from a worker thread.

        Args:
            live: other models are serving: the tuner does not measure (see the module's docstring).
            serving: with ``live``, the version of this model serving now, whose tuned choice is
                taken when the tuner's cache has none for this graph.

        Raises:
            RepositoryError: a missing or invalid manifest (naming the file and field), or a graph
                that does not match it.
            Exception: what ONNX Runtime raises for a graph it cannot load.
        """
        try:
            manifest = load_manifest(folder / "model.json")
        except ManifestError as exc:
            raise RepositoryError(str(exc)) from None
        preprocessor = Preprocessor(manifest.preprocessing, scaled_decode=self.scaled_decode)
        overrides = manifest.batching.model_dump() if manifest.batching is not None else {}
        config = self.batching.override(**overrides)

        def make_runner(intra: int, spinning: bool) -> OrtRunner:
            return OrtRunner(
                folder / "model.onnx",
                device=self.device,
                intra_op_threads=intra,
                inter_op_threads=self.inter_op_threads,
                intra_op_spinning=spinning,
                io_binding=self.io_binding,
                cuda=self.cuda,
            )

        plan, tuned, note = self.threads, None, "off"
        if self.tuner is not None and plan is not None:
            fixed_batch = overrides.get("max_batch_size") or (
                self.batching.max_batch_size if self.batch_size_fixed else None
            )
            # With a wide session the instances serve load, not lone requests: one single-threaded session per
            # core served more beside the decoders than the tuner's curve (ORT alone, no decoding) can show.
            fixed_instances = plan.instances if "instances" in plan.forced or plan.wide_threads else None

            def threads_for(n: int, plan: ThreadPlan = plan) -> tuple[int, bool]:  # plan bound: narrowed to not None
                """n instances -> (intra-op threads, spinning) each of them gets."""
                planned = plan.with_instances(n)
                return planned.intra_op_threads, planned.spinning

            tuned = self.tuner.run(
                name,
                version,
                folder / "model.onnx",
                preprocessor.output_shape,
                manifest.input.dtype,
                make_runner=make_runner,
                threads_for=threads_for,
                cores=plan.cores.cores,
                share=plan.share,
                fixed_instances=fixed_instances,
                fixed_batch_size=fixed_batch,
                cached_only=live,
            )
            note = _tuning_note(tuned, overrides, self.batch_size_fixed, fixed_instances, "instances" in plan.forced)
            if tuned is None and live:
                tuned, note = self._serving_choice(serving, fixed_batch, fixed_instances)
            if tuned is not None:
                plan = plan.with_instances(tuned.instances)
                config = config.override(max_batch_size=fixed_batch or tuned.max_batch_size)
        wide = None
        if plan is not None:
            runners = [make_runner(plan.intra_op_threads, plan.spinning) for _ in range(plan.instances)]
            if plan.wide_threads:  # it never runs beside the instances: computing_threads counted it already
                wide = make_runner(plan.wide_threads, plan.spinning)
                if self.tuner is not None and not live and "wide" not in plan.forced:
                    plan, wide = self._wide_if_it_pays(name, version, plan, runners[0], wide, preprocessor)
        else:
            runners = [make_runner(self.intra_op_threads, self.intra_op_spinning) for _ in range(self.instances)]
        check_graph(manifest, runners[0], folder)
        batcher = Batcher(
            [r.run for r in runners], config, model=name, version=str(version), wide=wide.run if wide else None
        )
        model = ModelVersion(
            name, version, folder, manifest, runners[0], preprocessor, batcher, instances=runners,
            threads=plan, tuning=tuned, tuning_note=note, wide=wide,
        )  # fmt: skip
        log.info(
            "model %s version %d: %s on %s; %s; max_batch_size %d",
            name, version, manifest.task, runners[0].providers.primary,
            plan.reason if plan is not None else f"{len(runners)} instance(s)", config.max_batch_size,
        )  # fmt: skip
        return model

    def _wide_if_it_pays(
        self, name: str, version: int, plan: ThreadPlan, instance: OrtRunner, wide: OrtRunner, pre: Preprocessor
    ) -> tuple[ThreadPlan, OrtRunner | None]:
        """Keep the wide session unless a lone input runs slower on it (:func:`wide_pays`), measured now."""
        c, h, w = pre.output_shape
        buckets = pre.spec.buckets
        if buckets:
            h, w = buckets[0].height, buckets[0].width
        alone, widened = self.lone_timer(instance.run, wide.run, blank_arguments((c, h, w), 1, bool(buckets)))
        if wide_pays(alone, widened):
            return plan, wide
        why = f"a lone run took {widened * 1e3:.3f} ms on it and {alone * 1e3:.3f} ms on one instance"
        log.info("model %s version %d: no wide session: %s", name, version, why)
        wide.close()
        return plan.without_wide(why), None

    @staticmethod
    def _serving_choice(
        serving: ModelVersion | None, fixed_batch: int | None, fixed_instances: int | None
    ) -> tuple[TuneResult | None, str]:
        """The tuned choice of the version serving now, for a live load that found nothing cached."""
        if serving is None or serving.tuning is None:
            return None, "not tuned: loaded while serving (no measurement then) and nothing cached for this graph"
        base = serving.tuning
        reused = TuneResult(
            fixed_instances or base.instances,
            fixed_batch or base.max_batch_size,
            list(base.points),
            source=f"reused from version {serving.version} (loaded while serving; nothing cached for this graph)",
            key=base.key,
            measured_at=base.measured_at,
            cache_file=base.cache_file,
        )
        return reused, f"not measured: loaded while serving; version {serving.version}'s choice reused"
