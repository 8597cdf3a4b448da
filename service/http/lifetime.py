"""How long an inference request may live: the deadline it asks for, and whether its client is still there.

A request may shorten the server's ``request_timeout`` (never lengthen it) with a ``timeout``
query parameter or ``X-Request-Timeout`` headers, in seconds; when several are given the
shortest wins. The deadline bounds the body's arrival too (:func:`body_by_deadline`: 504 once it
passes while the body still arrives). While its images are decoded, queued and run, the route watches the ASGI receive
channel: when the client disconnects, the work is cancelled, so queued images leave the batcher's
queue without being computed, and the request is counted with outcome ``cancelled``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Mapping
from typing import Annotated, TypeVar

from fastapi import Header, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.types import Receive

from service.core.errors import ClientDisconnected, DeadlineExceeded, ProblemError
from service.core.numbers import NO_UNDERSCORE
from service.http.problems import request_id

log = logging.getLogger(__name__)

T = TypeVar("T")

TIMEOUT_HEADER = "X-Request-Timeout"
DRAIN_SECONDS = 5.0  # most time spent reading a body that will not be used before answering its request
# request-state key: set while a route reads and drops the rest of a body it refused (a 413). Those bytes
# are never kept, so admission's body budget does not count them (service.http.middleware.admission).
BODY_DROPPED = "body_dropped"
# request-state key: admission's callable that counts more bytes of a body the request holds, once a route
# has made them (an inflated /v2 body); :func:`hold_more_body`.
HOLD_MORE_BODY = "hold_more_body"


def hold_more_body(request: Request, size: int) -> None:
    """Count ``size`` more bytes of body this request holds (an inflated /v2 body) in admission's budget.

    Admission counts a body at the size it arrives; a route that makes more of it (gzip's 1,000:1
    turns a 32 KiB upload into a 32 MiB one) adds what it made, held until the request is answered.
    A no-op when no admission middleware runs (an app built without it, in a test).

    Raises:
        Unavailable: 503 with ``Retry-After``, when ``size`` takes the worker past
            ``PATCHSERVE_MAX_BUFFERED_BYTES`` while other requests hold bodies (as a body arriving
            past it would; one request alone always gets in).
    """
    hold = request.scope.get("state", {}).get(HOLD_MORE_BODY)
    if hold is not None:
        hold(size)


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

    Stores the shortest of them (several headers count too; seconds, or None when none was sent) in
    ``request.state.requested_timeout``, for the inference routes' shared handler.
    """
    # (float | None, not QueryFloat: its validator in the union lost the schema's exclusiveMinimum)
    for where, name, raw in (("query", "timeout", timeout), ("header", TIMEOUT_HEADER.lower(), x_request_timeout)):
        sent = request.query_params.get(name) if where == "query" else request.headers.get(name)
        if raw is not None and sent is not None and "_" in sent:  # read as 10 from "1_0"
            raise RequestValidationError(
                [{"type": "value_error", "loc": (where, name), "msg": NO_UNDERSCORE, "input": sent}]
            )
    given = [t for t in (timeout, x_request_timeout) if t is not None]
    if len(headers := request.headers.getlist(TIMEOUT_HEADER)) > 1:  # FastAPI read the first one only
        given += [_timeout_header(value) for value in headers[1:]]  # (a gateway may add a tighter one after)
    request.state.requested_timeout = min(given, default=None)


def _timeout_header(value: str) -> float:
    """A further ``X-Request-Timeout`` value, checked as FastAPI checks the first (a 422 when it is not > 0)."""
    try:
        seconds = float(value) if "_" not in value else math.nan  # as for the first header: 1_0 is not 10
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        where = ("header", TIMEOUT_HEADER.lower())
        raise RequestValidationError(
            [{"type": "greater_than", "loc": where, "msg": "must be a number > 0", "input": value}]
        )
    return seconds


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


OVERLONG = 1 << 62  # what a Content-Length of more than 18 significant digits counts as: more than any cap


def content_length(value: str | bytes) -> int | None:
    """A ``Content-Length`` header's value as a number of bytes; None when it is not one.

    Leading zeros are dropped, and more than 18 digits count as :data:`OVERLONG`: Python refuses to
    parse a number of more than 4,300 digits (a ValueError), which httptools lets through.
    """
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0")
    return OVERLONG if len(digits) > 18 else int(digits or "0")


async def drain_body(receive: Receive, headers: Mapping[bytes, bytes], max_bytes: int, seconds: float) -> bool:
    """Read and drop the rest of a request's body (never kept: one chunk at a time); whether all of it was read.

    Sent before a refusal: a client that writes its whole body before reading its answer (most
    HTTP libraries) would otherwise get a TCP reset, the kernel's answer to a socket closed with
    unread data, instead of the answer (nginx's "lingering close" for the same reason). Nothing is
    read, and the answer goes at once, for a client waiting for ``100 Continue`` or a declared
    ``Content-Length`` over ``max_bytes``; reading stops at ``max_bytes``, after ``seconds``, or
    when the client goes away.

    Args:
        receive: the request's ASGI receive channel, its body partly read or not at all.
        headers: the request's headers, lower-case names.
    """
    if b"100-continue" in headers.get(b"expect", b"").lower():
        return False  # the client sends no body until told to: answer now
    declared = content_length(headers.get(b"content-length", b""))
    if declared is not None and declared > max_bytes:
        return False
    deadline = time.monotonic() + seconds
    read = 0
    while True:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                message = await receive()
        except (TimeoutError, ProblemError):  # late, or refused by the receive channel (the body budget)
            return False
        if message["type"] != "http.request":
            return False  # the client went away
        read += len(message.get("body", b""))
        if read > max_bytes:
            return False
        if not message.get("more_body", False):
            return True


async def body_by_deadline(
    read: Awaitable[T], seconds_left: float, request: Request | None = None, max_bytes: int = 0
) -> T:
    """Await ``read`` (the reading of a request's body) for at most ``seconds_left`` seconds.

    Args:
        request: the request whose body ``read`` reads; when its deadline passes first, the rest
            of its body (at most ``max_bytes``) is read and dropped before the 504 is sent
            (:func:`drain_body`), so that a client writing its whole body first reads the 504.

    Raises:
        DeadlineExceeded: the request's deadline passed while its body was still arriving (504,
            ``Connection: close``).
    """
    try:
        async with asyncio.timeout(max(seconds_left, 0.0)):  # 3.11's timeout re-raises an outside cancellation
            return await read
    except TimeoutError:
        if request is not None and request.scope.get("state", {}).get("body_done") is False:
            await drain_body(request.receive, dict(request.scope["headers"]), max_bytes, DRAIN_SECONDS)
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
