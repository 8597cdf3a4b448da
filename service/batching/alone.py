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

The claim is held while the image decodes, so it is taken only for a decode that is cheap: a
file of at most :data:`MAX_BYTES`, whose header (read first, in the thread) declares at most
:data:`MAX_PIXELS` decoded pixels; a larger one gives the claim back at once and takes the
batching path. Under load nothing is ever alone (requests overlap), and every request batches.
Tracing on, the batching path is always taken (its ``queue``, ``batch`` and ``compute`` spans).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np

from service.batching.arrays import BatchBuffers, BatchOutputMismatch, detach, pad_inputs, split_outputs, stack_inputs
from service.batching.config import InferenceResult, RunFn
from service.core.errors import InferenceFailed

log = logging.getLogger("service.batching.batcher")

MAX_BYTES = 1 << 20  # a file larger than this never claims a runner: its decode may be slow
MAX_PIXELS = 1 << 22  # nor one whose header declares more decoded pixels (after JPEG draft)


class LoneRun:
    """A runner claimed for one input: run it from the decode thread, then give the runner back.

    Made by :meth:`Batcher.claim_alone` on the event loop, which alone may call :meth:`release`;
    the decode thread calls :meth:`affordable`, :meth:`give_up` and :meth:`__call__`.

    Args:
        name: the model version, ``name/version`` (messages).
        run: the claimed runner's model, as the batcher calls it.
        buffers: the claimed runner's batch buffers (its own while the claim is held).
        done: called once on the event loop when the claim ends, with the run's compute seconds
            (None: the model was not run, or its run failed) and what the run raised that is not
            an Exception (None, or what kills the batching loop, as it would from a batch);
            gives the runner back.
        loop: the event loop the claim was made on.
    """

    def __init__(
        self,
        name: str,
        run: RunFn,
        buffers: BatchBuffers,
        done: Callable[[float | None, BaseException | None], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.name = name
        self._run = run
        self._buffers = buffers
        self._done = done
        self._loop = loop
        self._released = False
        self._compute: float | None = None
        self._fatal: BaseException | None = None

    @staticmethod
    def affordable(pixels: int) -> bool:
        """Whether an image that decodes to ``pixels`` pixels may keep the runner while it decodes."""
        return pixels <= MAX_PIXELS

    def give_up(self) -> None:
        """From the decode thread: the image takes the batching path; the runner goes back now."""
        self._loop.call_soon_threadsafe(self.release)

    def __call__(self, x: np.ndarray, bucket: tuple[int, int] | None) -> InferenceResult | InferenceFailed:
        """Blocking, in the decode thread: run the model on ``x`` as a batch of one.

        Args:
            x: the float32 (C, H, W) input.
            bucket: (H, W) to pad it to, with its int64 (1, H, W) pixel mask; None: as is.

        Returns:
            Its row of every output (queued 0 s, a batch of 1), or the 500 of a failed run, as a
            batch's (:func:`run_failed`; what is not an Exception also stops the batching loop
            when the claim is released).
        """
        started = time.perf_counter()
        try:
            if bucket is None:
                buffer = self._buffers.get(x.shape, x.dtype, 1)
                inputs = stack_inputs([x], out=buffer)
                outputs = self._run(inputs)
            else:
                buffer = self._buffers.get((x.shape[0], *bucket), x.dtype, 1)
                mask = self._buffers.get(bucket, np.dtype(np.int64), 1)
                inputs, mask = pad_inputs([x], buffer, mask)
                outputs = self._run(inputs, mask)
            row = split_outputs(detach(outputs, buffer), 1)[0]
        except Exception as exc:
            return run_failed(self.name, 1, exc)
        except BaseException as exc:  # as from a batch: the batching loop dies of it (release())
            self._fatal = exc
            return InferenceFailed(f"model {self.name}: the batching loop died while this batch ran: {exc!r}")
        self._compute = time.perf_counter() - started
        return InferenceResult(row, 0.0, self._compute, 1)

    def release(self) -> None:
        """On the event loop, once the decode thread has ended (or given up): the runner goes back (idempotent)."""
        if not self._released:
            self._released = True
            self._done(self._compute, self._fatal)


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
