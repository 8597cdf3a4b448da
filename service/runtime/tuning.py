"""The auto-tuner: at warm-up, measure a model's throughput on this machine and pick its batching.

For each instance count n in 1…N and batch size b in 1, 2, 4, … up to a bound, n sessions run
batches of b zeros concurrently, one thread each, for ``point_seconds``; images per second is
the point's throughput. The grid is measured in interleaved rounds (three by default: every
point, then every point again, ...) and each point is its median, because one 0.2 s point on
a shared CPU is noise (issue 14: ViT-Ti/16 gave b1 40, b2 34, b4 47 img/s in one bench run,
where ONNX Runtime alone on a quiet machine gives b1 82, b4 94). The whole measurement stops
at ``budget_seconds`` (what was measured by then is used), and a batch-size sweep stops early
once two sizes in a row gave under 90 % of its best. The CPU time other processes took
meanwhile is measured too (/proc/stat's busy time minus this process's): a result measured on
a busy machine is used but not cached, so the next start measures again.
:func:`choose` then takes the smallest instance count, and within it the smallest batch, whose
throughput is within ``tolerance`` (5 %) of the best measured: on the CPU, where the curve is
flat (ViT-Ti/16: b1 82, b4 94, b16 84 img/s), that is a small batch, which keeps latency low; on a
GPU, where it rises steeply, it is the largest batch that still pays.

The result is cached, one JSON file per model file and machine, keyed by the graph's SHA-256,
the CPU or GPU identity, ONNX Runtime's version, the threads the sessions get and the bounds,
so a restart reads it instead of measuring again. A file lock around "read, or measure and
write" makes the first worker process measure while the others wait and then read its result, and
:meth:`Tuner.exclusive` holds one lock around a worker's whole loading phase, so no two workers
measure at once: one measurement per server, taken while no other worker computes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

RunFn = Callable[[np.ndarray], Mapping[str, np.ndarray]]
TOLERANCE = 0.05  # within 5 % of the best throughput counts as as good
TURN_DOWN = 0.90  # a sweep stops once two batch sizes in a row give under 90 % of the best so far
BUSY = 0.25  # cores other processes may take while the tuner measures before its result is not cached
CACHE_VERSION = 1


@dataclass(frozen=True)
class Point:
    """One measured point: ``instances`` sessions running batches of ``batch_size``, images per second."""

    instances: int
    batch_size: int
    images_per_s: float


@dataclass
class TuneResult:
    """What the tuner chose and the curve it chose from.

    Attributes:
        instances, max_batch_size: the choice.
        points: the measured curve.
        source: "measured" (here, now) or "cache" (read from ``cache_file``).
        seconds: wall seconds the measurement took (0 when read from the cache).
        key: the cache key (graph hash, machine, threads, bounds).
        measured_at: ISO 8601 UTC time of the measurement.
        cache_file: where it is cached ("" when it could not be written or was not, the machine being busy).
        foreign_cores: CPU other processes took while it was measured, in cores.
    """

    instances: int
    max_batch_size: int
    points: list[Point]
    source: str = "measured"
    seconds: float = 0.0
    key: str = ""
    measured_at: str = ""
    cache_file: str = ""
    identity: dict = field(default_factory=dict)
    foreign_cores: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready, the curve as a list of {instances, batch_size, images_per_s}."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TuneResult:
        points = [Point(**p) for p in data.pop("points")]
        return cls(points=points, **data)

    def curve_text(self) -> str:
        """The curve on one line: "n=1: b1 82.0, b2 90.1, … img/s; n=2: …"."""
        by_n: dict[int, list[Point]] = {}
        for p in self.points:
            by_n.setdefault(p.instances, []).append(p)
        return "; ".join(
            f"n={n}: " + ", ".join(f"b{p.batch_size} {p.images_per_s:.1f}" for p in ps) + " img/s"
            for n, ps in sorted(by_n.items())
        )


def choose(points: Sequence[Point], tolerance: float = TOLERANCE) -> Point:
    """The point to serve with: the fewest instances, then the smallest batch, within ``tolerance`` of the best.

    Fewer instances first: each then gets more of the cores, so a lone request runs faster, and
    fewer sessions hold less memory. The smallest batch next: a request waits for, and computes
    with, fewer others.

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("nothing was measured")
    best = max(p.images_per_s for p in points)
    good = [p for p in points if p.images_per_s >= (1.0 - tolerance) * best]
    return min(good, key=lambda p: (p.instances, p.batch_size))


def batch_sizes(bound: int) -> list[int]:
    """1, 2, 4, … up to ``bound``, and ``bound`` itself."""
    sizes = []
    b = 1
    while b < bound:
        sizes.append(b)
        b *= 2
    return [*sizes, bound]


def measure_point(runners: Sequence[RunFn], batch: np.ndarray, seconds: float) -> float:
    """Images per second of ``runners`` each running ``batch`` over and over, one thread each, for ``seconds``.

    Every runner runs once first, uncounted; each then runs at least once more counted.
    """
    for run in runners:
        run(batch)
    done = [0] * len(runners)
    start = threading.Barrier(len(runners) + 1)
    deadline = [0.0]

    def loop(i: int) -> None:
        start.wait()
        while True:
            runners[i](batch)
            done[i] += len(batch)
            if time.perf_counter() >= deadline[0]:
                return

    threads = [threading.Thread(target=loop, args=(i,), name=f"tune-{i}") for i in range(len(runners))]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start.wait()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - began)


def measure(
    make_runners: Callable[[int], Sequence[RunFn]],
    input_shape: tuple[int, ...],
    *,
    dtype: str = "float32",
    instance_counts: Sequence[int],
    sizes: Sequence[int],
    point_seconds: float,
    budget_seconds: float,
    rounds: int = 1,
    measure_one: Callable[[Sequence[RunFn], np.ndarray, float], float] = measure_point,
    clock: Callable[[], float] = time.monotonic,
) -> list[Point]:
    """The throughput curve over ``instance_counts`` × ``sizes``, within ``budget_seconds``.

    The first round walks the grid (a batch-size sweep stops once two sizes in a row gave
    under 90 % of its best); each further round measures the same points again in the same
    order, so that a burst of foreign load or a noisy point lands in one round only, and each
    point's throughput is its median over the rounds it got (rounds stop at the budget too).
    The sessions of every instance count stay open until the last round.

    Args:
        make_runners: n -> n runners (sessions) of the model, ``(B, C, H, W) -> outputs``.
        input_shape: one input, (C, H, W).
        point_seconds: seconds each point is measured, per round.
        budget_seconds: once this much has passed no further point starts.
        rounds: passes over the grid (>= 1).
        measure_one, clock: injectable for tests.
    """
    started = clock()
    samples: dict[tuple[int, int], list[float]] = {}
    runners_of: dict[int, Sequence[RunFn]] = {}

    def batch_of(b: int) -> np.ndarray:
        return np.zeros((b, *input_shape), dtype=dtype)  # (B, C, H, W)

    for n in instance_counts:
        if clock() - started >= budget_seconds:
            break
        runners_of[n] = make_runners(n)
        best, below = 0.0, 0
        for b in sizes:
            if clock() - started >= budget_seconds:
                log.warning("auto-tune: the %.1f s budget ran out at n=%d, b=%d", budget_seconds, n, b)
                break
            throughput = measure_one(runners_of[n], batch_of(b), point_seconds)
            samples[(n, b)] = [throughput]
            best = max(best, throughput)
            below = below + 1 if throughput < TURN_DOWN * best else 0
            if below == 2:
                break  # two sizes in a row well below the best: the curve has turned down
    grid = list(samples)
    for _ in range(rounds - 1):
        for n, b in grid:
            if clock() - started >= budget_seconds:
                break
            samples[(n, b)].append(measure_one(runners_of[n], batch_of(b), point_seconds))
    runners_of.clear()
    return [Point(n, b, float(np.median(samples[(n, b)]))) for n, b in grid]


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


def machine_identity(provider: str, cores: int, ort_version: str) -> dict:
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


def cpu_clocks(proc_stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, user + nice + system; this process's CPU seconds).

    From ``/proc/stat``'s ``cpu`` line (proc(5), clock ticks) and ``os.times()``; (0, own) where
    there is no /proc, so the machine never looks busy there.
    """
    own = sum(os.times()[:2])
    try:
        line = next(ln for ln in proc_stat.read_text().splitlines() if ln.startswith("cpu "))
    except (OSError, StopIteration):
        return own, own
    user, nice, system = (int(v) for v in line.split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK"), own


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
