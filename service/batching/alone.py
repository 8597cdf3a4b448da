"""The idle fast path (issue 14, item 4): a lone input that finds its batcher idle runs in one trip to a thread.

At low load the batcher releases each image at once, for reason ``idle``; on a small model the
way there cost the event loop more than the model's compute: decode thread -> loop -> queue ->
the batcher's task -> a task for the batch -> the runner's thread -> loop. When a request's only
image arrives and the batcher is idle (its loop alive, nothing queued, nothing else on its way,
a runner available: exactly when the loop would release that image at once for ``idle``),
:meth:`~service.batching.batcher.Batcher.claim_alone` reserves the runner the loop would have
taken (:meth:`~service.batching.runners.RunnerPool.take`: the wide runner when every instance is
idle) and returns a :class:`Claim`; the request's own decode thread then decodes and preprocesses
the image and runs it (:meth:`Claim.run`): one hand-off to a thread and back.

It is recorded as the loop records a batch (:class:`~service.batching.records.BatchRecords`): an
``idle`` batch of 1, its queue time (from the end of its preprocessing to the run) and its
compute. While the claim holds its runner the loop gives queued inputs the other runners, or
waits for it, as it waits for a running batch; the claim gives it back when its thread ends.

A claim run never starts after the request stopped waiting for it (:meth:`Claim.abandon`: the
client went away, or the deadline passed while the image was decoded: 504), nor after its
deadline, nor once the loop has stopped (503); one that has started finishes, as a batch does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from service.batching.arrays import BatchBuffers, detach, pad_inputs, split_outputs, stack_inputs
from service.batching.clock import Clock
from service.batching.config import InferenceResult, RunFn
from service.batching.records import BatchRecords, failure_detail
from service.core import metrics
from service.core.errors import DeadlineExceeded, InferenceFailed, Unavailable

log = logging.getLogger(__name__)

IDLE = metrics.RELEASE_REASONS[2]
_WAITING, _RUNNING, _ABANDONED = "waiting", "running", "abandoned"


class Claim:
    """One runner reserved for one lone input, until :meth:`give_back`.

    Made by :meth:`~service.batching.batcher.Batcher.claim_alone` only.

    Args:
        run: the runner's model, ``(1, C, H, W) float32 [, (1, H, W) int64 mask] -> {output: (1, ...)}``.
        buffers: the runner's batch buffers (its own while it is claimed).
        records: the batch metrics of the model version.
        clock: the batcher's clock (seconds).
        give_back: hands the runner back to the batcher (on the event loop), with what killed the
            run when it was no Exception (it kills the batching loop, as in a batch's task), else None.
        alive: whether the batching loop still runs (read from the thread).
    """

    def __init__(
        self,
        run: RunFn,
        buffers: BatchBuffers,
        records: BatchRecords,
        clock: Clock,
        *,
        give_back: Callable[[BaseException | None], None],
        alive: Callable[[], bool],
    ) -> None:
        self._run = run
        self._buffers = buffers
        self._records = records
        self._clock = clock
        self._give_back: Callable[[BaseException | None], None] | None = give_back
        self._fatal: BaseException | None = None
        self._alive = alive
        self._lock = threading.Lock()
        self._state = _WAITING

    def run(self, x: np.ndarray, bucket: tuple[int, int] | None, deadline: float) -> InferenceResult:
        """Blocking, in the request's thread: run ``x`` alone on the claimed runner, unless it may no longer.

        Args:
            x: float32 (C, H, W), the preprocessed image.
            bucket: (H, W) to pad ``x`` to, run with its int64 pixel mask; None: as is.
            deadline: the request's deadline, on the batcher's clock.

        Returns:
            Its row of every output (batch axis removed), its queue and compute seconds, batch size 1.

        Raises:
            DeadlineExceeded: the deadline passed first, or the request stopped waiting (504; not run).
            Unavailable: the batching loop has stopped (503; not run).
            InferenceFailed: the run raised or returned outputs without one row (500); a BaseException
                that is no Exception also kills the batching loop, once :meth:`give_back` hands it on.
        """
        enqueued = self._clock.now()
        with self._lock:
            if self._state == _ABANDONED or enqueued >= deadline:
                self._state = _ABANDONED
                raise DeadlineExceeded(f"model {self._records.name}: the request's deadline passed before it ran")
            if not self._alive():
                self._state = _ABANDONED
                raise Unavailable(
                    f"model {self._records.name}: its batching loop stopped before this request ran; see /readyz"
                )
            self._state = _RUNNING
        self._records.released(IDLE, 1, 0.0, 0)
        started = self._clock.now()
        try:
            buffer = self._buffers.get(x.shape if bucket is None else (x.shape[0], *bucket), x.dtype, 1)
            if bucket is None:
                outputs = self._run(stack_inputs([x], out=buffer))  # (1, C, H, W)
            else:
                mask = self._buffers.get(bucket, np.dtype(np.int64), 1)  # (1, H, W)
                outputs = self._run(*pad_inputs([x], buffer, mask))
            row = split_outputs(detach(outputs, buffer), 1)[0]
        except Exception as exc:  # this batch fails alone, as in the loop
            detail = failure_detail(self._records.name, 1, exc)
            log.error("%s", detail, exc_info=exc)
            raise InferenceFailed(detail) from None
        except BaseException as exc:  # not an Exception: it kills the batching loop (give_back), as in a batch's task
            self._fatal = exc
            detail = f"model {self._records.name}: the batching loop died while this batch ran: {exc!r}"
            raise InferenceFailed(detail) from None
        compute = self._clock.now() - started
        self._records.ran(compute, (started - enqueued,))
        return InferenceResult(row, started - enqueued, compute, 1)

    def abandon(self) -> bool:
        """The request stops waiting (on the loop): True when its run will not start; False: it has started."""
        with self._lock:
            if self._state == _WAITING:
                self._state = _ABANDONED
            return self._state == _ABANDONED

    def give_back(self) -> None:
        """On the event loop, once the claim's thread has ended (or never started): the runner is free again."""
        if self._give_back is not None:
            give_back, self._give_back = self._give_back, None
            give_back(self._fatal)
