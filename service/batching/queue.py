"""The batcher's queue: requests in arrival order, each holding one place until taken, expired or cancelled.

:class:`RequestQueue` keeps the count of places held (``queued``, and the ``queue_depth`` gauge)
apart from the deque, which forgets requests that left only lazily (:meth:`RequestQueue.purge`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.batching.clock import Timer
from service.batching.config import InferenceResult
from service.core import tracing
from service.core.errors import BadRequest, DeadlineExceeded, Unavailable

log = logging.getLogger("service.batching.batcher")


@dataclass(eq=False)
class Request:
    """One queued input, its answer's future and its deadline (seconds on the batcher's clock)."""

    x: np.ndarray  # (C, H, W)
    future: asyncio.Future[InferenceResult]
    enqueued: float
    deadline: float
    queued: bool = True  # holds a place in the queue: not yet taken into a batch, expired or cancelled
    timer: Timer | None = None
    trace: tracing.Ticket | None = None  # its request's trace context (tracing on)
    bucket: tuple[int, int] | None = None  # (H, W) the input is padded to, with a pixel mask; None: as is

    @property
    def shape(self) -> tuple[tuple[int, ...], str]:
        """What a batch shares: the input's shape (its bucket's, when it has one) and dtype."""
        if self.bucket is not None:
            return (self.x.shape[0], *self.bucket), self.x.dtype.str
        return self.x.shape, self.x.dtype.str

    @property
    def key(self) -> tuple[tuple[tuple[int, ...], str], bool]:
        """What batch mates share: :attr:`shape`, and whether they are padded with a mask."""
        return self.shape, self.bucket is not None

    @property
    def waiting(self) -> bool:
        return self.queued and not self.future.done()

    def deadline_exceeded(self, name: str, now: float) -> DeadlineExceeded:
        """The 504 of this request of model version ``name``, still queued at ``now``."""
        return DeadlineExceeded(
            f"model {name}: the request's deadline passed after {now - self.enqueued:.3f} s in the queue, "
            "before a batch ran it"
        )


def live(batch: list[Request], now: float) -> tuple[list[Request], list[Request]]:
    """The last check before compute: (the requests to run, those cancelled or past their deadline).

    Only reads, so a runner's thread may call it: a future seen not done just as its client
    leaves costs a row computed for nobody.
    """
    kept: list[Request] = []
    dropped: list[Request] = []
    for request in batch:
        (dropped if request.future.done() or now >= request.deadline else kept).append(request)
    return kept, dropped


def drop_expired(name: str, batch: list[Request], now: float) -> list[Request]:
    """On the event loop: :func:`live`'s check, the expired answered 504; returns the requests to run.

    A request cancelled (the client went away) or answered already is left as it is; a request
    past its deadline is never run.
    """
    kept, dropped = live(batch, now)
    for request in dropped:
        if not request.future.done():
            request.future.set_exception(request.deadline_exceeded(name, now))
    if dropped:
        log.debug("model %s: dropped %d expired or cancelled request(s)", name, len(dropped))
    return kept


def fail_all(requests: list[Request], error: Callable[[], BaseException]) -> None:
    """Each request not answered yet (nor cancelled) gets an exception of its own, ``error()``."""
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error())


def log_release(name: str, batch: list[Request], reason: str, now: float, queued: int) -> None:
    """The debug log line of a batch released for ``reason`` at ``now``, ``queued`` requests left behind."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "model %s: batch of %d released (%s); its oldest request waited %.3f ms, %d still queued",
            name, len(batch), reason, (now - batch[0].enqueued) * 1e3, queued,
        )  # fmt: skip


class RequestQueue:
    """The queued requests of one batcher, oldest first.

    Args:
        depth: the ``patchserve_queue_depth`` gauge of the batcher's model version (anything with
            ``inc()`` and ``dec()``).
    """

    def __init__(self, depth: Any) -> None:
        self._requests: deque[Request] = deque()  # arrival order; answered requests are purged lazily
        self.queued = 0  # requests holding a place in the queue
        self._depth = depth

    def add(self, request: Request) -> None:
        """Queue ``request``: it holds a place until :meth:`leave` gives it back."""
        self._requests.append(request)
        self.queued += 1
        self._depth.inc()

    def leave(self, request: Request) -> None:
        """Give back the request's place in the queue (once)."""
        if request.queued:
            request.queued = False
            self.queued -= 1
            self._depth.dec()

    def purge(self) -> None:
        """Forget the requests that left (taken, expired or cancelled)."""
        if len(self._requests) > self.queued:
            self._requests = deque(request for request in self._requests if request.queued)

    def head_batch(self, max_batch_size: int) -> list[Request]:
        """The oldest waiting request and the waiting requests of its shape, oldest first, up to max_batch_size."""
        batch: list[Request] = []
        for request in self._requests:
            if not request.waiting:
                if request.queued:  # cancelled, and its submit has not run its cleanup yet
                    self.leave(request)
                continue
            if not batch or request.key == batch[0].key:
                batch.append(request)
                if len(batch) == max_batch_size:
                    break
        return batch

    def drain(self) -> list[Request]:
        """Every request still in the deque, each having left the queue; the queue is empty after."""
        requests = list(self._requests)
        for request in requests:
            self.leave(request)
        self._requests.clear()
        return requests


def admit(name: str, queue_size: int, queued: int, count: int, unit: str = "image(s)") -> None:
    """Refuse a request of ``count`` inputs (/v1 images, /v2 rows) unless a queue has room for all now.

    Args:
        name: the model version, ``name/version``.
        queue_size: the queue's places; ``queued``: those held now.
        unit: what an input is, in the messages.

    Raises:
        BadRequest: ``count`` exceeds the whole ``queue_size``: it could never be admitted,
            so a 400, not a 503 to retry (a /v2 client would retry it forever).
        Unavailable: the queue has no room for all of them now (503, Retry-After).
    """
    if count > queue_size:
        raise BadRequest(
            f"model {name} admits at most {queue_size} {unit.removesuffix('(s)')}s in one "
            f"request (its queue_size); this one has {count}. Send them in several requests"
        )
    room = queue_size - queued  # < 0 for a moment when requests admitted whole were all queued
    if count and room < count:  # nothing left to queue (every image ran alone or failed) is never refused
        raise Unavailable(
            f"model {name}: the queue is full for this request (room for {max(room, 0)} {unit}, "
            f"it has {count}); retry shortly"
        )
