"""Freed memory goes back to the system once a worker is idle (glibc's ``malloc_trim``).

glibc's allocator keeps what the process frees in its arenas (one per thread that allocates:
the event loop, the decode threads) for reuse, and returns to the system only the free space
at the top of each heap. After a burst of large bodies and images the worker's resident memory
stays at its peak: a fresh user's 120 chunked 18 MB uploads and 40 refused 20 MB JSON bodies
left an idle worker at 968 MiB, which ``malloc_trim(0)`` (glibc's ``malloc/malloc.c``: every
arena's free pages, ``madvise(MADV_DONTNEED)``) took back to 197 MiB at once. A fixed
``MALLOC_MMAP_THRESHOLD_`` of 4 MiB (large blocks unmapped when freed) did not lower it in a
measurement here.

:class:`IdleTrim` trims once the worker has held no request for :data:`IDLE_SECONDS`, and only
after it served some since the last trim: never while a request runs, so no request waits for
the arenas' locks it takes. On a C library without ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_SECONDS = 1.0  # a worker idle this long gives its freed memory back


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a callable (1 when memory was returned), None where the C library lacks it."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(trim(0))


class IdleTrim:
    """Calls ``trim`` (in a thread) once requests stop for ``idle_seconds``; :meth:`busy` and :meth:`idle` tell it.

    Args:
        trim: what gives memory back (:func:`malloc_trim`'s callable).
        idle_seconds: how long the worker holds no request before it trims.
    """

    def __init__(self, trim: Callable[[], int], idle_seconds: float = IDLE_SECONDS) -> None:
        self.trim = trim
        self.idle_seconds = idle_seconds
        self.trims = 0  # trims done (for tests and the log)
        self.last: asyncio.Future[None] | None = None  # the latest trim, once started
        self._pending: asyncio.TimerHandle | None = None
        self._served = False  # a request was admitted since the last trim

    def busy(self) -> None:
        """A request was admitted: no trim while it runs."""
        self._served = True
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def idle(self) -> None:
        """The worker holds no request now: trim in ``idle_seconds`` unless one comes first."""
        if self._served and self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self.idle_seconds, self._start)

    def _start(self) -> None:
        self._pending = None
        self._served = False
        self.last = asyncio.ensure_future(asyncio.to_thread(self._trim))

    def _trim(self) -> None:
        try:
            self.trim()
        except Exception:  # never a reason to stop serving
            log.exception("giving freed memory back failed")
        self.trims += 1
