"""Dynamic batching: concurrent requests for one model version share one ONNX Runtime call.

One :class:`Batcher` per model version and worker process; ``await submit(x, deadline=...)``
queues one input and returns its row of every output. The loop hands each batch to a free
runner (``PATCHSERVE_INSTANCES`` sessions: that many batches in flight), each turn the same
steps: collect -> drop expired/cancelled -> stack -> run -> check/split -> answer.

**Collect.** The oldest queued request leads the next batch; queued requests of its shape join
it, oldest first (a request with a padding bucket has its bucket's shape: images of several sizes
share the batch, padded, with a pixel mask). The batch leaves, and the reason is recorded (``patchserve_batches_total``
and a debug log line), at ``size`` (it holds ``max_batch_size``), at ``delay`` (its oldest has
waited ``max_queue_delay``, as in Triton), or at ``idle``: at once when the runner is idle and a
lone request is all that is queued, so low load never waits out the delay (two or more queued
means requests arrive together, and waiting up to the delay fills the batch). Shapes never
mix, and a request of another shape waits only for batches led by requests older than itself.

**Drop.** The queue is bounded (``queue_size``: one more gets 503 at once). A request still
queued at its deadline gets 504 there and then, even while the runner is busy; a cancelled one
(client gone) leaves at once. Neither is computed: the last check, in the runner's thread just
before stacking, drops any that expired or were cancelled in between.

**Stack, run, check/split, answer.** In the runner's own thread, the inputs are stacked (or
padded, with their mask) into its preallocated (B, C, H, W) buffer (:mod:`service.batching.arrays`),
the model is called once, every output is checked for one row per input, then split; the loop
answers. A failing batch fails only its own requests (500, saying why); the loop goes on. If the
loop itself dies, every request is answered, ``running`` (and ``/readyz``) turns False, and later ones get 503.

**Instances.** Given N runners (N sessions of one model: Triton's instance count), one batcher
feeds them all: it collects the next batch whenever one of them is idle, so up to N batches are
in flight at once; when none is idle, a full batch is handed to the instance whose run began
first, to start in its thread as soon as that run returns (:meth:`RunnerPool.stage`). A
*wide* runner (every core) may stand beside them for a request that arrives alone while they idle;
such a request may claim it (or an idle instance) and run in its decode thread (:meth:`claim_alone`).

Times are seconds on an injectable :class:`~service.batching.clock.Clock`, so tests drive the loop without
waiting. The queue's bookkeeping is :mod:`service.batching.queue`; the knobs :mod:`service.batching.config`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.batching.alone import Claims, LoneRun, run_failed
from service.batching.arrays import BatchBuffers, run_rows
from service.batching.clock import Clock, MonotonicClock
from service.batching.config import BatchingConfig, InferenceResult, RunFn
from service.batching.queue import Request, RequestQueue, admit, drop_expired, fail_all, live, log_release
from service.batching.runners import RunnerPool
from service.core import metrics, tracing
from service.core.errors import DeadlineExceeded, InferenceFailed, ProblemError, Unavailable

log = logging.getLogger(__name__)

SIZE, DELAY, IDLE = metrics.RELEASE_REASONS
Computed = tuple[float, list[Request], list[Request], list[dict[str, np.ndarray]] | Exception | None]


class Batcher:
    """Collects inputs of one shape into batches and runs them, one batch at a time per runner.

    Args:
        run: the model, ``(B, C, H, W) float32 -> {output name: (B, ...)}``; blocking, called
            from a thread of this batcher's own. Or a sequence of N such runners (N instances
            of the model): up to N batches are then in flight at once, one per runner.
        config: the batching knobs.
        model, version: the model version it serves (metric labels, logs, thread names).
        clock: the time source and timers (tests inject a manual one).
        wide: a runner with every core, for a batch of one that arrives while every instance is
            idle and nothing else waits; while it runs no instance starts
            (:mod:`service.batching.runners`). None: the instances take every batch.
    """

    def __init__(
        self,
        run: RunFn | Sequence[RunFn],
        config: BatchingConfig,
        *,
        model: str = "model",
        version: str = "1",
        clock: Clock | None = None,
        wide: RunFn | None = None,
    ) -> None:
        instances: list[RunFn] = [run] if callable(run) else list(run)
        self._pool = RunnerPool(len(instances), wide=wide is not None)
        self._runners = instances + ([wide] if wide is not None else [])
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.name = f"{model}/{version}"
        self._model_version = (model, version)
        self._series = metrics.BatchSeries(model, version)
        self._queue = RequestQueue(metrics.QUEUE_DEPTH.labels(model, version))
        self._in_flight: dict[asyncio.Task[None], list[Request]] = {}  # running batches
        self._fatal: BaseException | None = None  # what killed a batch and so the loop
        self._dead = threading.Event()  # set in a runner's thread by such a run: nothing staged runs after it
        self._began: set[int] = set()  # the batches (ids) whose run began in their runner's thread
        self._wake = asyncio.Event()  # set on every change that can make a batch due
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"run-{self.name}-{i}")
            for i in range(len(self._runners))
        ]
        self._buffers = [BatchBuffers(config.max_batch_size) for _ in self._runners]  # used in its thread only
        self._task: asyncio.Task[None] | None = None
        self._claims = Claims(
            self.name, self._pool, self._runners, self._buffers, self._series, self.clock.now, self._claim_ended
        )

    @property
    def running(self) -> bool:
        """True while the batching loop is alive."""
        return self._task is not None and not self._task.done()

    @property
    def instances(self) -> int:
        """How many model instances this batcher feeds batches to (the wide runner not counted)."""
        return self._pool.instances

    @property
    def wide_batches(self) -> int:
        """Batches the wide runner has run, lone requests' included (0 without one)."""
        return self._pool.wide_batches

    @property
    def staged_batches(self) -> int:
        """Batches handed to an instance behind its running one (:meth:`RunnerPool.stage`)."""
        return self._pool.staged_batches

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (each holds one of ``queue_size`` places)."""
        return self._queue.queued

    def admit(self, count: int, unit: str = "image(s)") -> None:
        """Refuse a request of ``count`` inputs (/v1 images, /v2 rows) unless the queue has room for all now.

        Raises:
            BadRequest, Unavailable: as :func:`~service.batching.queue.admit`.
        """
        admit(self.name, self.config.queue_size, self._queue.queued, count, unit)

    def arriving(self, count: int) -> contextlib.AbstractContextManager[None]:
        """``with batcher.arriving(n):`` n inputs on their way, not queued yet (:meth:`RunnerPool.arriving`).

        A lone request's claim still decoding is taken back: with another request on its way it is not alone.
        """
        self._claims.revoke()
        return self._pool.arriving(count)

    def claim_alone(self) -> LoneRun | None:
        """The runner claimed for the caller's one input, on its way (:meth:`arriving`) with no other
        (:mod:`service.batching.alone`); released by the caller on the loop. None if the loop is not
        running, tracing is on, or any other input is queued or on its way."""
        busy = not self.running or self._queue.queued or self._fatal is not None or tracing.enabled()
        return None if busy else self._claims.take()

    def _claim_ended(self, fatal: BaseException | None) -> None:
        self._fatal = self._fatal or fatal  # what a lone run raised that is not an Exception kills the loop
        self._wake.set()

    def _runner_free(self) -> bool:
        """A batch may start now; with inputs queued and no runner free, a claim still decoding is taken back."""
        if not self._pool.available() and self._queue.queued:
            self._claims.revoke()
        return self._pool.available()

    def deadline(self, timeout: float | None = None) -> float:
        """The deadline, on this batcher's clock, of a request arriving now; ``timeout``, the seconds the
        request asked for, may only shorten ``request_timeout`` (None: ``request_timeout``)."""
        limit = self.config.request_timeout if timeout is None else min(timeout, self.config.request_timeout)
        return self.clock.now() + limit

    async def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if not self.running:
            self._dead.clear()
            self._began.clear()
            self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Stop the loop; requests still queued or running are answered with 503."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
            if not self._task.cancelled() and self._task.exception() is not None:
                log.warning("model %s: the batching loop had died: %r", self.name, self._task.exception())
        self._claims.revoke()  # a lone request still decoding is queued (and answered 503) instead
        await self._claims.wait()  # one whose decode thread runs a runner's model ends first
        for executor in self._executors:  # a run in progress ends on its own
            await asyncio.to_thread(executor.shutdown, wait=True)

    def release(self) -> None:
        """After :meth:`stop`: drop the runners and the batch buffers, so their memory can be freed."""
        assert not self.running, "release a stopped batcher only"
        self._runners, self._buffers = [], []

    async def submit(
        self,
        x: np.ndarray,
        *,
        deadline: float | None = None,
        bucket: tuple[int, int] | None = None,
        whole: bool = False,
    ) -> InferenceResult:
        """Queue one input and wait for its row of the batch's outputs.

        Cancelling the caller (the client disconnected) takes the input out of the queue: it is
        never computed, and its place is free at once.

        Args:
            x: float32 array (C, H, W).
            deadline: when the request expires, on ``self.clock`` (see :meth:`deadline`);
                None: ``request_timeout`` from now.
            bucket: (H, W) to pad ``x`` to: it then shares batches with every input of that
                bucket, whatever its own size, and the runner is called as ``run(batch, mask)``
                with the int64 (B, H, W) pixel mask (:func:`pad_inputs`). None: ``x`` batches
                with inputs of its own shape only, and ``run(batch)``.
            whole: let in by :meth:`admit` with its request's other inputs: never refused for a full queue.

        Raises:
            Unavailable: the queue is full (unless ``whole``), or the batching loop is not running (503, Retry-After).
            DeadlineExceeded: the deadline passed before a batch took the input (504).
            InferenceFailed: the batch's run raised or returned the wrong number of rows (500).
        """
        if not self.running:
            raise Unavailable(f"model {self.name}: its batching loop is not running; see /readyz")
        now = self.clock.now()
        deadline = now + self.config.request_timeout if deadline is None else deadline
        if now >= deadline:
            raise DeadlineExceeded(f"model {self.name}: the request's deadline passed before it was queued")
        if self._queue.queued >= self.config.queue_size and not whole:
            raise Unavailable(f"model {self.name}: the queue is full ({self.config.queue_size} waiting); retry shortly")
        request = Request(
            x, asyncio.get_running_loop().create_future(), now, deadline, trace=tracing.queued(), bucket=bucket
        )
        request.timer = self.clock.call_at(deadline, functools.partial(self._expire, request))
        self._queue.add(request)
        self._wake.set()
        try:
            return await request.future
        finally:
            request.timer.cancel()
            if request.queued:  # cancelled while it waited
                self._queue.leave(request)
                self._wake.set()

    # The loop: collect -> drop expired/cancelled -> stack -> run -> check/split -> answer.

    async def _loop(self) -> None:
        stopped_by: ProblemError = Unavailable(f"model {self.name}: stopped (server shutdown or version unloaded)")
        try:
            while True:
                await self._until_a_runner_is_idle()
                batch, reason, staged = await self._collect()
                batch = drop_expired(self.name, batch, self.clock.now())
                if not batch:
                    continue
                log_release(self.name, batch, reason, self.clock.now(), self._queue.queued)
                runner = self._pool.stage() if staged else self._pool.take(len(batch), self._queue.queued)
                task = asyncio.create_task(self._run_batch(runner, batch, reason), name=f"batch-{self.name}-{runner}")
                self._in_flight[task] = batch
                task.add_done_callback(functools.partial(self._batch_done, runner))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("model %s: the batching loop died; the model is not ready", self.name, exc_info=exc)
            stopped_by = InferenceFailed(f"model {self.name}: the batching loop died while this batch ran: {exc!r}")
            raise
        finally:
            self._answer_everyone_left(stopped_by)

    async def _run_batch(self, runner: int, batch: list[Request], reason: str) -> None:
        """Stack -> run -> check/split (:meth:`_compute`, in the runner's thread) -> answer, for one batch."""
        trace = tracing.batch_started(*self._model_version, reason, [request.trace for request in batch])
        loop = asyncio.get_running_loop()
        try:
            computed = await loop.run_in_executor(self._executors[runner], self._compute, runner, batch)
        except Exception as exc:  # its executor would not take it
            computed = (self.clock.now(), batch, [], exc)
        started, kept, dropped, rows = computed
        self._began.discard(id(batch))
        drop_expired(self.name, dropped, self.clock.now())  # (the expired get their 504)
        tracing.batch_ended(trace, rows if isinstance(rows, Exception) else None)
        if rows is None:  # never run: a run before it killed the loop
            return fail_all(kept, self._stopped)
        if kept:
            self._series.release(len(kept), reason)  # counted as it ran (a staged batch may have emptied)
        if isinstance(rows, Exception):  # this batch fails alone; the loop goes on
            detail = run_failed(self.name, len(kept), rows).detail
            fail_all(kept, lambda: InferenceFailed(detail))
        elif kept:
            self._answer(kept, rows, started, self.clock.now() - started)

    def _compute(self, runner: int, batch: list[Request]) -> Computed:
        """In the runner's thread: the last check (a staged batch waited behind a run), stack, run, check, split.
        Returns (when it began, the requests run, those dropped, their rows or what the run raised)."""
        started = self.clock.now()
        kept, dropped = live(batch, started)
        if self._dead.is_set():
            return started, kept, dropped, None
        self._began.add(id(batch))
        rows: list[dict[str, np.ndarray]] | Exception | None = []
        try:
            if kept:
                rows = run_rows(self._runners[runner], self._buffers[runner], [r.x for r in kept], kept[0].bucket)
        except Exception as exc:
            rows = exc
        except asyncio.CancelledError as exc:  # raised by the model, not a cancellation: a failed run
            rows = RuntimeError(f"the run raised {exc!r}")
        except BaseException:  # it kills the loop (_batch_done); nothing staged behind any runner runs now
            self._dead.set()
            raise
        return started, kept, dropped, rows

    def _batch_done(self, runner: int, task: asyncio.Task[None]) -> None:
        """A batch's task ended: its runner is idle again; anything but an Exception kills the loop."""
        if not task.cancelled() and task.exception() is not None:
            self._fatal = task.exception()  # its batch stays in flight, to be answered as the loop dies
        else:
            self._in_flight.pop(task, None)  # (gone already when the loop ended and cancelled it)
        self._pool.give_back(runner)
        self._wake.set()

    async def _until_a_runner_is_idle(self) -> None:
        """Until a runner is idle, or a full batch could wait behind a running one (:meth:`RunnerPool.stage`)."""
        while not (self._runner_free() or self._pool.room_behind()) or self._fatal is not None:
            if self._fatal is not None:
                raise self._fatal
            self._wake.clear()
            await self._wake.wait()

    async def _collect(self) -> tuple[list[Request], str, bool]:
        """Wait until a batch is due; take its requests out of the queue. Returns (batch, reason, staged):
        staged, a full batch due while no runner is idle, to wait behind a running one."""
        while True:
            if self._fatal is not None:
                raise self._fatal
            self._queue.purge()  # forget requests taken, expired or cancelled
            batch = self._queue.head_batch(self.config.max_batch_size)
            available = self._runner_free()  # (not while a lone request runs on the runner it needs)
            reason = self._release_reason(batch) if batch and available else None
            staged = not available and len(batch) >= self.config.max_batch_size and self._pool.room_behind()
            if reason is not None or staged:
                for request in batch:
                    self._queue.leave(request)
                return batch, reason or SIZE, staged
            timer = None
            if batch and available:  # wake up when its oldest request has waited max_queue_delay
                timer = self.clock.call_at(batch[0].enqueued + self.config.max_queue_delay, self._wake.set)
            self._wake.clear()
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _release_reason(self, batch: list[Request]) -> str | None:
        """Why ``batch`` should leave now (size, delay or idle), or None to keep waiting."""
        if len(batch) >= self.config.max_batch_size:
            return SIZE
        if self.clock.now() >= batch[0].enqueued + self.config.max_queue_delay:
            return DELAY
        if self._queue.queued == 1:  # we are collecting, so a runner is idle, and this is all there is
            return IDLE
        return None

    def _answer(self, batch: list[Request], rows: list[dict[str, np.ndarray]], started: float, compute: float) -> None:
        self._series.compute.observe(compute)
        for request, row in zip(batch, rows, strict=True):
            queued_for = started - request.enqueued
            self._series.queue.observe(queued_for)
            if not request.future.done():
                request.future.set_result(InferenceResult(row, queued_for, compute, len(batch)))

    # Deadlines, and the end of the loop.
    def _expire(self, request: Request) -> None:
        """The deadline timer: a request still queued is answered 504 now and leaves the queue."""
        if not request.waiting:
            return
        self._queue.leave(request)
        request.future.set_exception(request.deadline_exceeded(self.name, self.clock.now()))
        self._wake.set()

    def _answer_everyone_left(self, in_flight_error: ProblemError) -> None:
        """The loop is ending: answer the batches it was running and every queued request."""
        self._dead.set()  # a batch staged behind a run never begins now (_compute)
        for task, batch in self._in_flight.items():
            task.cancel()  # a run in progress ends on its own, in its thread; nobody waits for it
            fail_all(batch, self._stopped if id(batch) not in self._began else lambda: in_flight_error)
        self._in_flight = {}
        fail_all(self._queue.drain(), self._stopped)

    def _stopped(self) -> Unavailable:
        return Unavailable(f"model {self.name}: its batching loop stopped before this request ran; see /readyz")
