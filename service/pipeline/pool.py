"""The decode pool: a thread pool that knows whether a job submitted now would start at once; awaiting its jobs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from service.core.errors import DeadlineExceeded

P = ParamSpec("P")
T = TypeVar("T")


class DecodePool(ThreadPoolExecutor):
    """``ThreadPoolExecutor(threads)`` that counts the jobs submitted and not yet ended.

    A lone request claims its model's runner before its image is decoded
    (:mod:`service.batching.alone`); it does so only when a decode thread is free (:attr:`idle`),
    so the claimed runner never sits idle while the job waits behind other images' decodes.

    Args:
        threads: the pool's threads (``PATCHSERVE_DECODE_THREADS``, or the worker's share of cores).
        thread_name_prefix: its threads' names (``decode``).
    """

    def __init__(self, threads: int, thread_name_prefix: str = "") -> None:
        super().__init__(threads, thread_name_prefix=thread_name_prefix)
        self.threads = threads
        self._pending = 0  # submitted, not ended (queued or running)
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet ended (queued or running)."""
        return self._pending

    @property
    def idle(self) -> bool:
        """Whether a job submitted now would start at once (fewer jobs pending than threads)."""
        return self._pending < self.threads

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            self._pending += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._ended(None)
            raise
        future.add_done_callback(self._ended)  # in the thread that ends it (or here, if it already has)
        return future

    def _ended(self, _: object) -> None:
        with self._lock:
            self._pending -= 1


def in_pool(pool: Executor, fn: Callable[..., Any], *args: Any) -> tuple[asyncio.Future[Any], Future[Any]]:
    """``fn(*args)`` submitted to ``pool`` (as ``run_in_executor``): the loop's future and the pool's job.

    :func:`until` cancels the job when nobody waits for it any more: one still queued never runs.
    """
    job = pool.submit(fn, *args)
    return asyncio.wrap_future(job), job


async def until(
    deadline: float, clock_now: Callable[[], float], future: asyncio.Future[Any], what: str, job: Future[Any]
) -> Any:
    """Await a decode-pool ``future`` (of ``job``, :func:`in_pool`) until ``deadline`` (on the batcher's clock).

    ``what`` ends the 504's message: "the request's deadline passed while {what}".

    A Pillow decode running in a thread cannot be interrupted: the pre-scan's and the pixel
    limits bound its work, and the request still answers at its deadline while it runs on. A job
    still queued when the deadline passes or the request is cancelled (its client left) is
    dropped, never run: abandoned requests' decodes held up every request behind them (a fresh
    user's 20 hung-up uploads of slow images kept the pool busy, and the next request waiting,
    for 28 s). The future's done callbacks then run as the job's cancellation reaches the loop.

    Raises:
        DeadlineExceeded: the deadline passed first (504).
    """
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # its fault, if any, is retrieved
    try:
        return await asyncio.wait_for(asyncio.shield(future), max(deadline - clock_now(), 0.0))
    except TimeoutError:
        job.cancel()  # queued: never runs; running: runs on, its callbacks when it ends
        raise DeadlineExceeded(f"the request's deadline passed while {what}") from None
    except BaseException:
        job.cancel()
        raise
