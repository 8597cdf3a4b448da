"""Dynamic batching: concurrent requests for one model version share one ONNX Runtime call.

The interface the rest of the server uses is :class:`Batcher`: ``await submit(x)`` returns
this input's row of every output. This module holds a simple implementation (size and delay
only); the full one (idle fast path, deadlines, cancellation) replaces it behind the same
interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service import metrics
from service.errors import InferenceFailed, Unavailable

log = logging.getLogger(__name__)

RunFn = Callable[[np.ndarray], dict[str, np.ndarray]]


@dataclass(frozen=True)
class BatchingConfig:
    """Batching knobs for one model version (Triton's dynamic-batcher names).

    Attributes:
        max_batch_size: most inputs in one run.
        max_queue_delay: seconds the oldest queued input may wait for the batch to fill.
        queue_size: most inputs waiting; one more is refused with 503.
    """

    max_batch_size: int
    max_queue_delay: float
    queue_size: int


@dataclass(frozen=True)
class InferenceResult:
    """One input's share of a batch run.

    Attributes:
        outputs: each graph output's row for this input, batch axis removed.
        queue_seconds: from ``submit`` to the start of the run.
        compute_seconds: the whole batch's run time.
        batch_size: how many inputs shared the run.
    """

    outputs: dict[str, np.ndarray]
    queue_seconds: float
    compute_seconds: float
    batch_size: int


@dataclass
class _Pending:
    x: np.ndarray
    future: asyncio.Future[InferenceResult]
    enqueued: float


class Batcher:
    """Collects inputs of one shape into batches and runs them one at a time.

    Args:
        run: the model, ``(B, C, H, W) float32 -> {output name: (B, ...)}``; blocking, called
            from this batcher's own thread.
        config: the batching knobs.
        model, version: the model version it serves (metric labels, logs, thread names).
    """

    def __init__(self, run: RunFn, config: BatchingConfig, *, model: str = "model", version: str = "1") -> None:
        self._run = run
        self.config = config
        self.name = f"{model}/{version}"
        self._queue_depth = metrics.QUEUE_DEPTH.labels(model, version)
        self._queue_duration = metrics.QUEUE_DURATION.labels(model, version)
        self._compute_duration = metrics.COMPUTE_DURATION.labels(model, version)
        self._batch_size = metrics.BATCH_SIZE.labels(model, version)
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=config.queue_size)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"run-{self.name}")
        self._task: asyncio.Task[None] | None = None
        self._carry: _Pending | None = None  # first input of the next batch (a different shape)

    @property
    def running(self) -> bool:
        """True while the batching loop is alive."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Stop the loop; inputs still queued are answered with 503."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            self._queue_depth.dec()
            if not pending.future.done():
                pending.future.set_exception(Unavailable("the server is shutting down"))
        self._executor.shutdown(wait=True)

    async def submit(self, x: np.ndarray) -> InferenceResult:
        """Queue one input and wait for its result.

        Args:
            x: float32 array (C, H, W).

        Raises:
            Unavailable: the queue is full (503 with Retry-After).
            InferenceFailed: the batch's run raised or returned the wrong number of rows.
        """
        future: asyncio.Future[InferenceResult] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(x, future, time.perf_counter()))
            self._queue_depth.inc()
        except asyncio.QueueFull:
            raise Unavailable(f"model {self.name}: the queue is full ({self.config.queue_size})") from None
        return await future

    async def _get(self, timeout: float | None) -> _Pending:
        if timeout is None:
            item = await self._queue.get()
        elif timeout <= 0:
            item = self._queue.get_nowait()
        else:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        self._queue_depth.dec()
        return item

    async def _next_batch(self) -> list[_Pending]:
        first = self._carry or await self._get(None)
        self._carry = None
        batch = [first]
        release_at = first.enqueued + self.config.max_queue_delay
        while len(batch) < self.config.max_batch_size:
            timeout = release_at - time.perf_counter()
            try:
                item = await self._get(timeout)
            except (asyncio.QueueEmpty, TimeoutError):
                break
            if item.x.shape != first.x.shape:
                self._carry = item  # inputs of different shapes never share a batch
                break
            batch.append(item)
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [p for p in await self._next_batch() if not p.future.done()]
            if not batch:
                continue
            started = time.perf_counter()
            try:
                stacked = np.stack([p.x for p in batch])  # (B, C, H, W)
                outputs = await loop.run_in_executor(self._executor, self._run, stacked)
                for name, value in outputs.items():
                    if value.shape[0] != len(batch):
                        raise RuntimeError(f"output {name!r} has {value.shape[0]} rows for {len(batch)} inputs")
            except Exception as exc:
                log.exception("model %s: batch of %d failed", self.name, len(batch))
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(InferenceFailed(f"the model run failed for this batch: {exc}"))
                continue
            compute = time.perf_counter() - started
            self._compute_duration.observe(compute)
            self._batch_size.observe(len(batch))
            for i, p in enumerate(batch):
                self._queue_duration.observe(started - p.enqueued)
                if not p.future.done():
                    row = {name: value[i] for name, value in outputs.items()}
                    p.future.set_result(InferenceResult(row, started - p.enqueued, compute, len(batch)))
