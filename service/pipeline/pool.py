"""The decode pool: a thread pool that knows whether a job submitted now would start at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

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
