"""The auto-tuner: measure (or read from the cache) one model version's curve at warm-up and choose.

:class:`Tuner` holds the settings and applies them to one model version; :func:`tune` reads the
cache or measures under its lock, and keeps the result only when the machine was quiet.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from service.runtime.tuning.cache import TuneCache, cache_key, graph_digest, machine_identity
from service.runtime.tuning.curve import TOLERANCE, Point, TuneResult, batch_sizes, choose
from service.runtime.tuning.measure import RunFn, cpu_clocks, measure

log = logging.getLogger(__name__)

BUSY = 0.25  # cores other processes may take while the tuner measures before its result is not cached


def tune(
    name: str,
    version: int,
    key: str,
    *,
    cache: TuneCache | None,
    run_measurement: Callable[[], list[Point]],
    tolerance: float = TOLERANCE,
    identity: Mapping[str, object] | None = None,
    clocks: Callable[[], tuple[float, float]] = cpu_clocks,
    busy_cores: float = BUSY,
) -> TuneResult:
    """The cached result for ``key``, or a new measurement (cached for next time if the machine was quiet).

    Args:
        name, version: the model version (file names, logs).
        key: :func:`cache_key` of the graph, the machine and the request.
        cache: where results are kept (None: always measure, keep nothing).
        run_measurement: measures the curve (:func:`measure` with its arguments bound).
        clocks: (machine busy CPU seconds, own CPU seconds) now; see :func:`cpu_clocks`.
        busy_cores: other processes taking more cores than this meanwhile: the result is not cached.
    """
    with cache.lock(key) if cache is not None else contextlib.nullcontext():
        if cache is not None and (cached := cache.load(name, version, key)) is not None:
            log.info(
                "model %s version %d: auto-tune result from %s: %d instance(s), max_batch_size %d",
                name, version, cached.cache_file, cached.instances, cached.max_batch_size,
            )  # fmt: skip
            return cached
        started, (busy, own) = time.monotonic(), clocks()
        points = run_measurement()
        seconds, (busy_after, own_after) = time.monotonic() - started, clocks()
        foreign = max(0.0, (busy_after - busy) - (own_after - own)) / max(seconds, 1e-9)
        chosen = choose(points, tolerance)
        result = TuneResult(
            chosen.instances,
            chosen.batch_size,
            points,
            seconds=seconds,
            key=key,
            measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            identity=dict(identity or {}),
            foreign_cores=foreign,
        )
        if foreign > busy_cores:
            result.source = "measured on a busy machine: not cached"
            log.warning(
                "model %s version %d: other processes took %.2f cores while the auto-tuner measured; its choice "
                "is used but not cached, and the next start measures again", name, version, foreign,
            )  # fmt: skip
        elif cache is not None:
            result.cache_file = cache.store(name, version, result)
    log.info(
        "model %s version %d: auto-tuned in %.1f s: %d instance(s), max_batch_size %d; curve %s",
        name, version, result.seconds, result.instances, result.max_batch_size, result.curve_text(),
    )  # fmt: skip
    return result


@dataclass(frozen=True)
class Tuner:
    """The auto-tuner's settings, applied to one model version at a time by :meth:`run`.

    Attributes:
        cache: where results are kept (None: nowhere).
        point_seconds: seconds per measured point and round.
        budget_seconds: most seconds per model.
        rounds: interleaved passes over the grid; each point is its median over them.
        max_batch_size: the largest batch size tried (0: 16 on the CPU, 64 on a GPU).
        max_instances: the most instances tried (on the CPU also at most the model's cores).
        ort_version: ONNX Runtime's version (part of the cache key).
        busy_cores: other processes' load (cores) above which a measurement is not cached.
    """

    cache: TuneCache | None
    point_seconds: float = 0.2
    budget_seconds: float = 10.0
    rounds: int = 3
    max_batch_size: int = 0
    max_instances: int = 2
    ort_version: str = ""
    busy_cores: float = BUSY

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """A lock across worker processes for a whole loading phase (every model's tuning and sessions).

        Held around loading, it lets one worker measure all its models while the others wait,
        so no two workers measure at once, nor one while another builds its sessions.
        """
        return self.cache.lock("loading-phase") if self.cache is not None else contextlib.nullcontext()

    def run(
        self,
        name: str,
        version: int,
        graph: Path,
        input_shape: tuple[int, int, int],
        dtype: str,
        *,
        make_runner: Callable[[int, bool], object],
        threads_for: Callable[[int], tuple[int, bool]],
        cores: int,
        share: int,
        fixed_instances: int | None = None,
        fixed_batch_size: int | None = None,
        cached_only: bool = False,
    ) -> TuneResult | None:
        """Measure (or read from the cache) one model version's curve and choose from it.

        With ``cached_only`` (a version loaded while others serve) nothing is measured: the cached
        result for this graph, whatever version it was cached under, or None.

        Args:
            graph: its model.onnx.
            input_shape: one input (C, H, W); dtype its numpy dtype name.
            make_runner: (intra-op threads, spinning) -> a runtime.OrtRunner of this graph.
            threads_for: n instances -> (intra-op threads, spinning) each of them gets.
            cores: the process's usable cores; share: the model's share of them.
            fixed_instances, fixed_batch_size: values a setting or the manifest fixed (not tuned).

        Returns:
            The result, or None when there is nothing to tune (both fixed) or the session did
            not get the provider it asked for (the model will not be ready; nothing measured).
        """
        if fixed_instances is not None and fixed_batch_size is not None:
            return None
        probe = make_runner(*threads_for(1 if fixed_instances is None else fixed_instances))
        choice = probe.providers  # type: ignore[attr-defined]
        if not choice.ok:
            return None
        gpu = choice.primary.startswith("CUDA")
        bound = self.max_batch_size or (64 if gpu else 16)
        sizes = [fixed_batch_size] if fixed_batch_size is not None else batch_sizes(bound)
        most = self.max_instances if gpu else min(self.max_instances, max(1, share))
        counts = [fixed_instances] if fixed_instances is not None else list(range(1, most + 1))
        identity = machine_identity(choice.primary, cores, self.ort_version)
        request = {
            "input": [*input_shape],
            "dtype": dtype,
            "instances": counts,
            "batch_sizes": sizes,
            "threads": {str(n): list(threads_for(n)) for n in counts},
            "point_seconds": self.point_seconds,
            "budget_seconds": self.budget_seconds,
            "rounds": self.rounds,
            "tolerance": TOLERANCE,
            "rule": "median within tolerance, or rounds overlapping the best's",  # a new rule measures afresh
        }
        key = cache_key(graph_digest(graph), identity, request)
        if cached_only:
            cached = self.cache.load(name, version, key, any_version=True) if self.cache is not None else None
            if cached is not None:
                log.info("model %s version %d: auto-tune result from %s (loaded while serving)", name, version,
                         cached.cache_file)  # fmt: skip
            return cached

        def make_runners(n: int) -> list[RunFn]:
            threads, spinning = threads_for(n)
            if n == counts[0] and (threads, spinning) == threads_for(counts[0]):
                first = [probe]
            else:
                first = [make_runner(threads, spinning)]
            return [r.run for r in first + [make_runner(threads, spinning) for _ in range(n - 1)]]  # type: ignore[attr-defined]

        def run_measurement() -> list[Point]:
            return measure(
                make_runners,
                input_shape,
                dtype=dtype,
                instance_counts=counts,
                sizes=sizes,
                point_seconds=self.point_seconds,
                budget_seconds=self.budget_seconds,
                rounds=self.rounds,
            )

        return tune(
            name,
            version,
            key,
            cache=self.cache,
            run_measurement=run_measurement,
            identity=identity,
            busy_cores=self.busy_cores,
        )
