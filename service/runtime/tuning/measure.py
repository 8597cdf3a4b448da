"""The auto-tuner's measurement: the throughput curve of n sessions running batches of b zeros.

Points are measured in interleaved rounds, each point's throughput its median over them, within
a time budget; :func:`cpu_clocks` says how much CPU other processes took meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from service.core import lifecycle
from service.runtime.tuning.curve import Point

log = logging.getLogger(__name__)

RunFn = Callable[[np.ndarray], Mapping[str, np.ndarray]]
TURN_DOWN = 0.90  # a sweep stops once two batch sizes in a row give under 90 % of the best so far
WIDE_GAIN = 1.0  # the wide session is kept unless a lone input runs slower on it (wide_pays)


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
    stop: Callable[[], None] = lifecycle.stop_if_shutting_down,
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
        stop: called before each point; raises to end the measurement (by default
            :class:`~service.core.lifecycle.StartupStopped` once the process is shutting down).
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
            stop()
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
            stop()
            samples[(n, b)].append(measure_one(runners_of[n], batch_of(b), point_seconds))
    runners_of.clear()
    return [
        Point(n, b, float(np.median(samples[(n, b)])), low=min(samples[(n, b)]), high=max(samples[(n, b)]))
        for n, b in grid
    ]


def lone_run_seconds(
    instance: Callable[..., object],
    wide: Callable[..., object],
    args: tuple[np.ndarray, ...],
    *,
    runs: int = 15,
    budget_seconds: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """(seconds of one lone run on one instance, on the wide session): each session's fastest run.

    Each session runs ``args`` once uncounted, then the two take turns (so a burst of foreign
    load lands on both) ``runs`` times, or until ``budget_seconds`` have passed after at least 3.

    The fastest run, not the median: it is what each session can do on these cores, and the
    comparison is between the two sessions, not of the machine. On the 2-vCPU KVM machines this
    was built on, a two-thread ONNX Runtime run went through stretches of seconds at about one
    thread's speed (ViT-Ti/16 25.3 against 16.2 ms; ``vit-cifar10`` 3.36 against 2.07 ms) while
    one-thread runs kept theirs (``python -m bench.phases``, 2026-12-07, docs/performance.md); a
    median taken in such a stretch dropped the wide session for the server's whole life
    (``vit-cifar10``: 3.952 against 3.960 ms in the benchmark of 05:20 UTC). The fastest run helps
    only when the stretch ends within the check (about 0.1 s for ``vit-cifar10``): see :func:`wide_pays`.

    Raises:
        ValueError: ``runs`` < 1.

    Args:
        instance, wide: the two sessions' run functions, ``(*args) -> outputs``.
        args: one input as the runner is called with it: ``(batch,)`` or ``(batch, pixel mask)``.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    instance(*args)
    wide(*args)
    started = clock()
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(runs):
        if i >= 3 and clock() - started >= budget_seconds:
            break
        for run, kept in ((instance, times[0]), (wide, times[1])):
            began = clock()
            run(*args)
            kept.append(clock() - began)
    return min(times[0]), min(times[1])


def wide_pays(instance_seconds: float, wide_seconds: float, gain: float = WIDE_GAIN) -> bool:
    """Whether a lone input runs at least ``gain`` times as fast on the wide session as on one instance.

    ``gain`` is 1.0: the wide session is kept unless it runs *slower*. What a second thread costs a
    small graph (its start and its spinning) shows in every measurement: ``vit-digits`` (0.09 ms a
    run) ran at 0.58-0.76x on two threads in the start-ups recorded in docs/performance.md, and the
    second thread, spinning while the decode thread wanted the core, cost it 11 % of its
    lone-request throughput (item 12 there). What it gains a large graph shows only outside the
    machine's slow stretches (:func:`lone_run_seconds`): ``vit-cifar10`` ran 1.55x as fast on two
    threads outside one (``bench.phases``: 2.07 against 3.21 ms), 1.00x and 1.03x at the starts of the
    benchmark runs of 05:20 and 07:56 UTC on 2026-12-07, which the 1.1x asked before left it out of.
    A start-up inside a slow stretch can still measure the wide session a hair slower and leave it
    out; this makes that rarer, not impossible. A wide session that gains nothing costs nothing
    under load: it runs only lone inputs.
    """
    return wide_seconds * gain <= instance_seconds


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
