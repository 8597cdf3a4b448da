"""The batcher's test doubles: a manual clock, a fake model that records its batches, and waiting helpers."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from prometheus_client import REGISTRY

from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig, InferenceResult

HANG_GUARD = 10.0  # seconds; only so that a broken batcher fails a test instead of hanging it


_names = itertools.count()


@dataclass
class _Timer:
    when: float
    callback: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to; its timers fire inside :meth:`advance`."""

    def __init__(self) -> None:
        self.t = 0.0
        self._timers: list[_Timer] = []

    def now(self) -> float:
        return self.t

    def call_at(self, when: float, callback: Callable[[], object]) -> _Timer:
        timer = _Timer(when, callback)
        self._timers.append(timer)
        return timer

    def jump(self, seconds: float) -> None:
        """Move time without firing timers, as when an event loop runs its timers late."""
        self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds
        due = sorted((timer for timer in self._timers if timer.when <= self.t), key=lambda timer: timer.when)
        self._timers = [timer for timer in self._timers if timer.when > self.t]
        for timer in due:
            if not timer.cancelled:
                timer.callback()


class FakeModel:
    """Stands in for the ONNX session. Each input is an array filled with one id; the model
    records the ids of every batch and returns ``id`` (B, 1) and ``total`` (B,) per input.

    ``gate``: while cleared, a run waits for it (the runner is busy). ``fail_with``: the next
    run raises it. ``rows_missing``: outputs come back with that many rows fewer than inputs.
    """

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        self.rows_missing = 0

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.batches.append([int(v) for v in x[:, 0, 0, 0]])
        self.gate.wait(HANG_GUARD)
        if self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            raise exc
        flat = x.reshape(len(x), -1)[: len(x) - self.rows_missing]
        return {"id": flat[:, :1].copy(), "total": flat.sum(axis=1)}


def item(ident: int, shape: tuple[int, int, int] = (1, 2, 2)) -> np.ndarray:
    """One (C, H, W) float32 input filled with ``ident``."""
    return np.full(shape, ident, dtype=np.float32)


def ids(results: list[InferenceResult]) -> list[int]:
    return [int(result.outputs["id"][0]) for result in results]


async def settle() -> None:
    """Let every task that is ready run (the batching loop included); time does not move."""
    for _ in range(20):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for something a runner thread does (a hang guard, not a timing assertion)."""
    for _ in range(int(HANG_GUARD / 0.001)):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


async def result(awaitable):
    return await asyncio.wait_for(awaitable, HANG_GUARD)


def released(batcher: Batcher) -> dict[str, float]:
    """``patchserve_batches_total`` of this batcher, by reason."""
    model, version = batcher.name.split("/")
    labels = {"model": model, "version": version}
    return {
        reason: REGISTRY.get_sample_value("patchserve_batches_total", {**labels, "reason": reason}) or 0.0
        for reason in ("size", "delay", "idle")
    }


def queue_depth(batcher: Batcher) -> float:
    model, version = batcher.name.split("/")
    return REGISTRY.get_sample_value("patchserve_queue_depth", {"model": model, "version": version})


@asynccontextmanager
async def running(model: FakeModel, clock: ManualClock, **config: float) -> AsyncIterator[Batcher]:
    values = {"max_batch_size": 4, "max_queue_delay": 0.5, "queue_size": 16, "request_timeout": 30.0, **config}
    batcher = Batcher(model, BatchingConfig(**values), model=f"fake-{next(_names)}", version="1", clock=clock)
    await batcher.start()
    try:
        yield batcher
    finally:
        model.gate.set()
        await batcher.stop()


@asynccontextmanager
async def busy_runner(batcher: Batcher, model: FakeModel) -> AsyncIterator[asyncio.Future]:
    """Keep the runner busy with a plug request (id 99) until the block ends."""
    model.gate.clear()
    plug = asyncio.ensure_future(batcher.submit(item(99)))
    await until(lambda: len(model.batches) == 1)
    try:
        yield plug
    finally:
        model.gate.set()


@asynccontextmanager
async def running_instances(
    models: list[FakeModel], clock: ManualClock | None = None, wide: FakeModel | None = None, **config: float
) -> AsyncIterator[Batcher]:
    """A started batcher feeding ``models`` (one instance each) and the ``wide`` runner; stopped after."""
    values = {"max_batch_size": 2, "max_queue_delay": 0.5, "queue_size": 16, "request_timeout": 30.0, **config}
    name = f"fake-{next(_names)}"
    batcher = Batcher(
        models, BatchingConfig(**values), model=name, version="1", clock=clock or ManualClock(), wide=wide
    )
    await batcher.start()
    try:
        yield batcher
    finally:
        for model in [*models, *([wide] if wide else [])]:
            model.gate.set()
        await batcher.stop()
