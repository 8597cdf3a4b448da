"""How long an inference request may live: the deadline it asks for, and whether its client is still there.

A request may shorten the server's ``request_timeout`` (never lengthen it) with a ``timeout``
query parameter or an ``X-Request-Timeout`` header, in seconds; when both are given the
shorter wins. The deadline bounds the body's arrival too (:func:`body_by_deadline`: 504 once it
passes while the body still arrives). While its images are decoded, queued and run, the route watches the ASGI receive
channel: when the client disconnects, the work is cancelled, so queued images leave the batcher's
queue without being computed, and the request is counted with outcome ``cancelled``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Header, Query, Request

from service.core.errors import ClientDisconnected, DeadlineExceeded
from service.http.problems import request_id

log = logging.getLogger(__name__)

T = TypeVar("T")

TIMEOUT_HEADER = "X-Request-Timeout"


async def requested_timeout(  # async: a plain def dependency would run in FastAPI's thread pool
    request: Request,
    timeout: Annotated[
        float | None,
        Query(
            gt=0,
            allow_inf_nan=False,
            description="Seconds this request may wait for a batch; shortens the server's request_timeout, "
            "never lengthens it. Still queued at the deadline: 504.",
        ),
    ] = None,
    x_request_timeout: Annotated[
        float | None,
        Header(gt=0, allow_inf_nan=False, description=f"The same as `timeout`, as a header ({TIMEOUT_HEADER})."),
    ] = None,
) -> None:
    """Router dependency: validate the requested timeout (422 when not a number > 0) and keep it.

    Stores the shorter of the two (seconds, or None when neither was sent) in
    ``request.state.requested_timeout``, for the inference routes' shared handler.
    """
    given = [t for t in (timeout, x_request_timeout) if t is not None]
    request.state.requested_timeout = min(given, default=None)


async def until_disconnected(request: Request) -> None:
    """Return when the client disconnects.

    Only once the body has been read: it reads the ASGI receive channel, where a server sends
    ``http.disconnect`` when the connection closes.
    """
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise.

    Raises:
        ClientDisconnected: the client went away first (outcome ``cancelled``); ``work`` has
            been cancelled and has finished.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done() or watcher.exception() is not None:  # the watcher failing is no reason to drop the work
        watcher.cancel()
        return await task
    task.cancel()
    await asyncio.wait({task})
    log.info("request %s: the client disconnected before its response was ready; work dropped", request_id(request))
    raise ClientDisconnected("the client disconnected before the response was ready")


async def body_by_deadline(read: Awaitable[T], seconds_left: float) -> T:
    """Await ``read`` (the reading of a request's body) for at most ``seconds_left`` seconds.

    Raises:
        DeadlineExceeded: the request's deadline passed while its body was still arriving (504,
            ``Connection: close``: the rest of the body is never read).
    """
    try:
        async with asyncio.timeout(max(seconds_left, 0.0)):  # 3.11's timeout re-raises an outside cancellation
            return await read
    except TimeoutError:
        raise DeadlineExceeded(
            "the request's deadline passed while its body was still arriving; send it faster, or give it a "
            "longer timeout (?timeout=, X-Request-Timeout, up to PATCHSERVE_REQUEST_TIMEOUT)",
            headers={"Connection": "close"},
        ) from None


def deadline_passed_after_the_body() -> DeadlineExceeded:
    """The 504 of a request whose deadline passed once its body was in, before its work began."""
    return DeadlineExceeded(
        "the request's deadline passed before its work could begin; give it a longer timeout "
        "(?timeout=, X-Request-Timeout, up to PATCHSERVE_REQUEST_TIMEOUT)"
    )
