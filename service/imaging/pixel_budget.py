"""The decoded pixels one worker holds at once: a budget its requests' images wait for (issue 15 F).

A 1.6 KB lossless WebP decodes to 6300x6300 pixels (about 600 MiB at Pillow's peak), so the
number of files a worker decodes at once says nothing about its memory; their pixels do.
Before an image is decoded, the pixels its header declares (a JPEG's after its DCT downscale)
are reserved here; they are returned once it is preprocessed and its full-size picture
dropped. An image that does not fit waits, in arrival order, until it fits or its request's
deadline passes (504); one that alone is larger than the whole budget could never fit and is
refused at once (413). The budget only counts: the memory it bounds is the decoders'.

Every method runs on the worker's event loop except :meth:`PixelBudget.try_acquire`, which a
decode thread may call: a lock guards the count that both change.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from service.core.errors import DeadlineExceeded, PayloadTooLarge
from service.imaging.images import LINE_PIXELS


class PixelBudget:
    """``capacity`` decoded pixels, reserved and returned by a worker's images, first come first served.

    Args:
        capacity: pixels (width x height as decoded) held at once by all images together.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a pixel budget needs a capacity of at least 1 pixel")
        self.capacity = capacity
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._lock = threading.Lock()  # held and the waiters' order, against try_acquire from a decode thread

    @property
    def waiting(self) -> int:
        """Images waiting for room."""
        return len(self._waiting)

    def _wake(self) -> None:
        """Grant waiters in arrival order while the first of them fits (no overtaking: a large
        image is never starved by a stream of small ones)."""
        while self._waiting:
            pixels, future = self._waiting[0]
            if future.done():  # gave up (deadline or cancellation) before it was granted
                self._waiting.popleft()
                continue
            with self._lock:
                if self.held + pixels > self.capacity:
                    return
                self._waiting.popleft()
                self.held += pixels
            future.set_result(None)

    def release(self, pixels: int) -> None:
        """Give back ``pixels`` that :meth:`acquire` or :meth:`try_acquire` granted (on the loop)."""
        with self._lock:
            self.held -= pixels
        self._wake()

    def try_acquire(self, pixels: int) -> bool:
        """Hold ``pixels`` now if they fit and nobody waits; never waits. Safe from any thread.

        The decode pool's one-trip path (:func:`service.pipeline.decoding.decode_alone`)
        reserves an image's pixels here between reading its header and decoding it; when this
        returns False the request waits for room on the loop with :meth:`acquire` instead.
        The holder gives them back with :meth:`release`, on the loop.
        """
        with self._lock:
            if self._waiting or self.held + pixels > self.capacity:
                return False
            self.held += pixels
            return True

    async def acquire(self, pixels: int, timeout: float | None) -> None:
        """Wait until ``pixels`` fit, then hold them until :meth:`release`.

        Raises:
            PayloadTooLarge: ``pixels`` is more than the whole budget (413), at once.
            DeadlineExceeded: no room within ``timeout`` seconds (504).
        """
        if pixels > self.capacity:
            raise PayloadTooLarge(
                f"the image decodes to {pixels} pixels' worth (its pixels, and {LINE_PIXELS} a row or column), "
                f"more than this worker decodes at once ({self.capacity}, PATCHSERVE_MAX_DECODING_PIXELS)"
            )
        if self.try_acquire(pixels):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((pixels, future))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(future)
        except BaseException as exc:
            if future.done() and not future.cancelled():
                self.release(pixels)  # granted just as it gave up: give it back
            else:
                future.cancel()
                self._wake()  # it may have been the one holding the queue up
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded(
                    f"the request's deadline passed while this image waited for decoding room ({pixels} pixels of "
                    f"{self.capacity}, PATCHSERVE_MAX_DECODING_PIXELS); retry, or send smaller images"
                ) from None
            raise

    @asynccontextmanager
    async def reserve(self, pixels: int, timeout: float | None) -> AsyncIterator[None]:
        """Hold ``pixels`` of the budget for the body of the ``async with``.

        Args:
            pixels: what the image decodes to, width x height (>= 0).
            timeout: seconds to wait for room at most (None: no limit).

        Raises:
            PayloadTooLarge: ``pixels`` is more than the whole budget (413), at once.
            DeadlineExceeded: no room within ``timeout`` seconds (504).
        """
        await self.acquire(pixels, timeout)
        try:
            yield
        finally:
            self.release(pixels)
