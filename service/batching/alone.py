"""A lone request's fast path: its image decoded and its model run in one trip to the decode pool.

A request that arrives while its batcher has nothing to do (nothing queued, running or on its
way) would take the batching path to a batch of one: decode in a pool thread, back to the event
loop, queued, collected by the batching loop, handed to the runner's thread and back. For a small
model those hand-offs cost more than the run: ``vit-digits`` at concurrency 1 spent 0.71 ms a
request on the event loop against the naive endpoint's 0.37 ms, whose handler decodes and runs in
one thread (``python -m bench.profile``; docs/performance.md). Here the request claims, on the
event loop and before its image is decoded, the runner that batch of one would take (the wide
runner when there is one, else an idle instance: :meth:`RunnerPool.take`), and the decode thread
runs the model as soon as the input is preprocessed. No batch starts while the claim is held, so
the threads that compute never outnumber the cores, as on the batching path.

While the image decodes the claim is only a reservation: as soon as another request starts
decoding (:meth:`Batcher.arriving`), or inputs are queued with no runner free for them, it is
taken back (:meth:`Claims.revoke`), and the image, once decoded, is queued as any other. Once
the decode thread has started the run, the claim holds until the run ends. The claim is taken
only when a decode thread is free and the decode is cheap: a file of at most :data:`MAX_BYTES`,
whose header (read first, in the thread) declares at most :data:`MAX_PIXELS` decoded pixels; a
larger one gives the claim back at once. Under load nothing is ever alone (requests overlap),
and every request batches. Tracing on, the batching path is always taken (its ``queue``,
``batch`` and ``compute`` spans).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from service.batching.arrays import BatchBuffers, BatchOutputMismatch, run_rows
from service.batching.config import InferenceResult, RunFn
from service.batching.runners import RunnerPool
from service.core import metrics
from service.core.errors import InferenceFailed

log = logging.getLogger("service.batching.batcher")

MAX_BYTES = 1 << 20  # a file larger than this never claims a runner: its decode may be slow
MAX_PIXELS = 1 << 22  # nor one whose header declares more decoded pixels (after JPEG draft)
PENDING, RUNNING, CLOSED = "pending", "running", "closed"  # a claim's states (LoneRun)


class LoneRun:
    """A runner claimed for one input: run it from the decode thread, then give the runner back.

    Made by :meth:`Claims.take` on the event loop, which alone calls :meth:`abandon`, :meth:`revoke`
    and :meth:`release`; the decode thread calls :meth:`affordable`, :meth:`give_up` and
    :meth:`__call__`. Its state moves once, under a lock, from pending to running (the thread
    starts the run) or to closed (revoked, given up, abandoned or expired: it will not run).

    Args:
        name: the model version, ``name/version`` (messages).
        run: the claimed runner's model, as the batcher calls it.
        buffers: the claimed runner's batch buffers (its own while the claim is held).
        done: called once on the event loop when the claim ends, with whether the model was
            called, its compute seconds (None: not called, or its run failed) and what the run
            raised that is not an Exception (None, or what kills the batching loop, as it would
            from a batch); gives the runner back.
        loop: the event loop the claim was made on.
        now: the batcher's clock (deadlines are on it).
    """

    def __init__(
        self,
        name: str,
        run: RunFn,
        buffers: BatchBuffers,
        done: Callable[[bool, float | None, BaseException | None], None],
        loop: asyncio.AbstractEventLoop,
        now: Callable[[], float],
    ) -> None:
        self.name = name
        self._run = run
        self._buffers = buffers
        self._done = done
        self._loop = loop
        self._now = now
        self._abandoned = threading.Event()
        self._lock = threading.Lock()
        self._state = PENDING
        self._released = False
        self._ran = False
        self._compute: float | None = None
        self.seconds = 0.0  # how long __call__ ran the model, failed or not (read once the thread has ended)
        self._fatal: BaseException | None = None

    @staticmethod
    def affordable(pixels: int) -> bool:
        """Whether an image that decodes to ``pixels`` pixels may keep the runner while it decodes."""
        return pixels <= MAX_PIXELS

    def _close(self) -> bool:
        """Pending -> closed (it will not run); False when it was no longer pending."""
        with self._lock:
            if self._state != PENDING:
                return False
            self._state = CLOSED
            return True

    def give_up(self) -> None:
        """From the decode thread: the image takes the batching path; the runner goes back now."""
        if self._close():
            self._loop.call_soon_threadsafe(self.release)

    def revoke(self) -> None:
        """On the event loop: a batch needs the runner; taken back now unless the run has started."""
        if self._close():
            self.release()

    def abandon(self) -> None:
        """On the event loop: nobody waits for the answer any more (a 504 at the deadline, or the client left)."""
        self._abandoned.set()

    def __call__(
        self, x: np.ndarray, bucket: tuple[int, int] | None, deadline: float
    ) -> InferenceResult | InferenceFailed | None:
        """Blocking, in the decode thread: run the model on ``x`` as a batch of one.

        Args:
            x: the float32 (C, H, W) input.
            bucket: (H, W) to pad it to, with its int64 (1, H, W) pixel mask; None: as is.
            deadline: the request's, on the batcher's clock.

        Returns:
            Its row of every output (queued 0 s, a batch of 1), or the 500 of a failed run, as a
            batch's (:func:`run_failed`; what is not an Exception also stops the batching loop
            when the claim is released); None, not run, when the request was abandoned or its
            deadline has passed (as the batching path never computes an expired input).
        """
        with self._lock:
            if self._state != PENDING or self._abandoned.is_set() or self._now() >= deadline:
                self._state = CLOSED
                return None
            self._state = RUNNING
        started = time.perf_counter()
        self._ran = True
        try:
            row = run_rows(self._run, self._buffers, [x], bucket)[0]
        except Exception as exc:
            return run_failed(self.name, 1, exc)
        except BaseException as exc:  # as from a batch: the batching loop dies of it (release())
            self._fatal = exc
            return InferenceFailed(f"model {self.name}: the batching loop died while this batch ran: {exc!r}")
        finally:
            self.seconds = time.perf_counter() - started
        self._compute = self.seconds
        return InferenceResult(row, 0.0, self._compute, 1)

    def release(self) -> None:
        """On the event loop, when the decode thread has ended, gave up or was revoked: the claim ends once."""
        if not self._released:
            self._released = True
            self._done(self._ran, self._compute, self._fatal)


def run_failed(name: str, batch_size: int, exc: Exception) -> InferenceFailed:
    """The 500 of a batch whose run raised ``exc`` (or returned outputs that do not match it), logged.

    Args:
        name: the model version, ``name/version``.
        batch_size: how many inputs the batch held.
    """
    if isinstance(exc, BatchOutputMismatch):
        detail = f"model {name} returned outputs that do not match its batch of {batch_size}: {exc}"
    else:
        detail = f"model {name}: the run failed for this batch of {batch_size}: {type(exc).__name__}: {exc}"
    log.error("%s", detail, exc_info=exc)
    return InferenceFailed(detail)


class Claims:
    """The lone requests' claims on one batcher's runners (:meth:`Batcher.claim_alone`).

    Args:
        name: the model version, ``name/version``.
        pool, runners, buffers: the batcher's runner pool, its runners' models and batch buffers.
        series: the batcher's metrics; a claim that ran counts as a batch of one released at ``idle``.
        now: the batcher's clock.
        ended: called on the event loop as each claim ends, with what its run raised that is not
            an Exception (None, or what kills the batching loop).
    """

    def __init__(
        self,
        name: str,
        pool: RunnerPool,
        runners: list[RunFn],
        buffers: list[BatchBuffers],
        series: metrics.BatchSeries,
        now: Callable[[], float],
        ended: Callable[[BaseException | None], None],
    ) -> None:
        self._name, self._pool, self._runners, self._buffers = name, pool, runners, buffers
        self._series, self._now, self._ended = series, now, ended
        self._held: dict[int, LoneRun] = {}  # by runner
        self._none_held = asyncio.Event()
        self._none_held.set()

    def take(self) -> LoneRun | None:
        """Claim the runner a lone input would take now (:meth:`RunnerPool.claim_alone`), or None."""
        runner = self._pool.claim_alone()
        if runner is None:
            return None
        done = functools.partial(self._end, runner)
        claim = LoneRun(
            self._name, self._runners[runner], self._buffers[runner], done, asyncio.get_running_loop(), self._now
        )
        self._held[runner] = claim
        self._none_held.clear()
        return claim

    def revoke(self) -> None:
        """Take back every claim whose image is still decoding: queued inputs need a runner."""
        for claim in list(self._held.values()):
            claim.revoke()

    async def wait(self) -> None:
        """Until no claim is held (a decode thread may still be running a runner's model)."""
        await self._none_held.wait()

    def _end(self, runner: int, ran: bool, compute: float | None, fatal: BaseException | None) -> None:
        del self._held[runner]
        if not self._held:
            self._none_held.set()
        self._pool.give_back(runner, claim=True, ran=ran)
        if ran:
            self._series.release(1, metrics.RELEASE_REASONS[2])  # idle
            log.debug("model %s: a lone request's batch of 1 ran in its decode thread (idle)", self._name)
        if compute is not None:
            self._series.compute.observe(compute)
            self._series.queue.observe(0.0)
        self._ended(fatal)
