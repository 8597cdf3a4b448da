"""Admission: what a worker lets in, before any body is kept or any image decoded (DESIGN.md, "Receive").

Three limits, all answered as problem+json (on /v2 as the protocol's ``{"error": ...}``):

* **Requests in flight.** Each worker holds at most ``max_in_flight`` requests at once; one more
  is refused with 503 and ``Retry-After`` before it runs, its body never kept, so a burst
  cannot pile up uploads, decoded images or queued tensors in memory. What the ``exempt``
  predicate picks is never refused (by default liveness, readiness and metrics: ``/healthz``,
  ``/readyz``, ``/metrics``; the app adds KServe's probes, :func:`service.http.app.admission_exempt`):
  a busy server stays observable and is not restarted for being busy. Behind this cap the batcher's bounded queue
  (503) and request deadlines (504) apply. The refused request's body is read and dropped
  (never kept: one chunk at a time, at most ``drain_bytes`` and :data:`DRAIN_SECONDS`) before
  the 503 is sent: a client that writes its whole body before reading its answer (most HTTP
  libraries, with ``Connection: close``) would otherwise get a TCP reset, the kernel's answer to
  a socket closed with unread data, instead of the 503 (nginx's "lingering close" for the same
  reason). A body that does not arrive within that bound, or a client that waits for
  ``100 Continue``, gets the 503 at once with ``Connection: close``.
* **Body bytes held.** The bodies of the requests a worker holds add up to at most
  ``max_buffered_bytes``: a request whose ``Content-Length`` would take them past it waits, its
  body unread, oldest first, until there is room (one body of any size the cap allows always gets
  in when the worker holds none; one over the cap holds nothing: its route refuses it), and is
  refused as above (503, drained) if none came within :data:`WAIT_SECONDS` (and ``body_timeout``)
  or the server began to shut down; a chunked body is counted as it arrives, and refused (503,
  drained) once it passes; a /v2 body sent compressed counts again at its inflated size once its
  route inflates it (:func:`~service.http.lifetime.hold_more_body`: 503 past the budget, as a body
  arriving past it). Its bytes are held until the request is answered. Without it, 200
  clients posting 17 MB of photos each took a worker from 170 MiB to 2.4 GiB (128 in flight; found
  by a fresh user), whatever the pixel budget.
* **Body-read time.** The whole body must arrive within ``body_timeout`` seconds of the request's
  arrival, else 408 and the connection is closed (a slow or stalled upload cannot hold a slot).

Refusals are counted in ``patchserve_requests_total{outcome="rejected"}`` under the model the
path names (``_unknown`` when there is no such model).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core import lifecycle
from service.core.errors import BodyTimeout, Unavailable
from service.core.memory import IdleTrim
from service.http import accounting
from service.http.lifetime import BODY_DROPPED, HOLD_MORE_BODY, content_length, drain_body
from service.http.problems import error_response_for

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
Exempt = Callable[[Scope], bool]  # whether admission lets an HTTP request through as it is
# Most seconds a refused request's body is read for (and the body timeout): a 17 MB upload among
# 200 took ~10 s to arrive on a loaded 2-core machine, and 5 s turned most such 503s into resets.
DRAIN_SECONDS = 30.0
WAIT_SECONDS = 10.0  # most a request waits for room in the body budget (and its body timeout): then 503
SHUTDOWN_POLL_SECONDS = 0.25  # how often a waiting request looks whether the server is shutting down
# Reads are bounded with asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for with a timeout
# of 0 cancels a read before it runs (a body that had long arrived got a 408 when the app reached it
# late), and wait_for can swallow a cancellation that arrives as the read completes, losing an outer
# deadline (service.http.lifetime.body_by_deadline). A read that does not have to wait returns at once.


_DRAINING_SEND = "admission_draining_send"  # (state keys) its send drains a body refused mid-way first
_DRAIN_FIRST = "admission_drain_first"  # the body was refused mid-way: drain it before the answer


def exempt_paths(scope: Scope) -> bool:
    """A request for one of :data:`EXEMPT_PATHS`, by any method: the default :data:`Exempt`."""
    return scope["path"] in EXEMPT_PATHS


def _declared_length(scope: Scope) -> int:
    """The body bytes a request of a route that reads bodies declares (its ``Content-Length``; 0 when
    absent or not a number, which its route refuses, and for every other route: they read none)."""
    path = scope["path"]
    if scope.get("method") != "POST" or not (path.startswith("/v1/models/") or path.startswith("/v2/")):
        return 0  # (a keyless POST to a public path such as / would otherwise wait in the queue)
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return content_length(value) or 0
    return 0


class AdmissionMiddleware:
    """Pure ASGI middleware: the in-flight cap (503) and the body-read timeout (408) of one worker.

    Args:
        app: the ASGI application behind it.
        max_in_flight: most requests (exempt ones aside) this worker holds at once.
        body_timeout: seconds from a request's arrival to the end of its body.
        retry_after: the ``Retry-After`` of a refusal, in seconds.
        exempt: whether an HTTP request is let through as it is: never refused, no body timeout,
            not counted in flight (its ``scope``; by default :func:`exempt_paths`).
        drain_bytes: most body bytes read and dropped before a refusal is sent (the body cap).
        max_buffered_bytes: most body bytes the requests held keep at once (None: no bound).
        idle: told when the worker takes a request and when it holds none any more (gives freed
            memory back once idle: :class:`~service.core.memory.IdleTrim`).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        body_timeout: float,
        retry_after: int = 1,
        exempt: Exempt = exempt_paths,
        drain_bytes: int = 32 * 1024 * 1024,
        max_buffered_bytes: int | None = None,
        idle: IdleTrim | None = None,
    ) -> None:
        self.app = app
        self.drain_bytes = drain_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.buffered = 0  # body bytes of the requests held: declared, or received when more
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self.max_in_flight = max_in_flight
        self.body_timeout = body_timeout
        self.retry_after = retry_after
        self.exempt = exempt
        self.in_flight = 0
        self.idle = idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await self._refuse(scope, receive, send)
            return
        arrived = time.monotonic()
        declared = _declared_length(scope)
        # the bytes this request holds of the worker's body budget; none for a body over the cap,
        # which its route refuses (413) at once: it must not wait, nor make others wait, for room
        held = [declared if declared <= self.drain_bytes else 0]
        self.in_flight += 1
        if self.idle is not None:
            self.idle.busy()
        try:
            if not await self._reserve(held[0], arrived + min(self.body_timeout, WAIT_SECONDS)):
                # (at a shutdown, answered at once: waiting for the body would hold up the drain)
                await self._refuse(
                    scope, receive, send, self._budget_message(), drain=not lifecycle.shutdown_requested()
                )
                return
            state = scope.setdefault("state", {})
            state[HOLD_MORE_BODY] = lambda size: self._hold_more(held, size)
            if not declared and scope.get("method") == "POST":  # chunked (or no body counted): a 503 may come mid-body
                state[_DRAINING_SEND] = True
                send = self._draining_send(receive, send, state, held)
            try:
                await self.app(scope, self._with_deadline(receive, state, held, arrived), send)
            finally:
                self._give_back(held[0])
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self.idle is not None:
                self.idle.idle()

    def _draining_send(self, receive: Receive, send: Send, state: dict[str, Any], held: list[int]) -> Send:
        """``send`` that, before the 503 of a chunked body past the budget, gives its bytes back and drains it.

        Read and dropped (at most ``drain_bytes``, :data:`DRAIN_SECONDS`; else ``Connection: close``)
        so that a client writing its whole body first reads the 503, not a reset (http.client's
        chunked uploads); its bytes go back first (the route dropped them with the error), so the
        drain does not keep the others out: holding them through it, 40 concurrent 19 MB uploads
        were all refused.
        """

        async def send_after_drain(message: Message) -> None:
            if message["type"] == "http.response.start" and state.pop(_DRAIN_FIRST, False):
                self._give_back(held[0])
                held[0] = 0
                if not await drain_body(receive, {}, self.drain_bytes, min(DRAIN_SECONDS, self.body_timeout)):
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return send_after_drain

    def _fits(self, more: int) -> bool:
        """Whether ``more`` body bytes fit the worker's budget (always when it holds none)."""
        limit = self.max_buffered_bytes
        return limit is None or self.buffered == 0 or self.buffered + more <= limit

    async def _reserve(self, size: int, deadline: float) -> bool:
        """Take ``size`` bytes of the budget, waiting for room, oldest first, until ``deadline``; whether taken.

        While a request waits its body is not read: TCP holds the client back (uvicorn buffers at
        most 64 KiB of an unread body), so the wait costs neither memory nor the CPU of a refusal.
        Nothing reads a waiting request, so a client that goes away meanwhile is not noticed: its
        slot is held until the wait ends (at most :data:`WAIT_SECONDS`). A shutdown ends every wait.
        """
        if size == 0 or (not self._waiting and self._fits(size)):  # no body (a GET): never waits
            self.buffered += size
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((size, turn))
        try:
            while not turn.done() and not lifecycle.shutdown_requested():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):  # wakes to look at the shutdown flag
                    async with asyncio.timeout(min(left, SHUTDOWN_POLL_SECONDS)):  # (wait_for can lose a cancel)
                        await asyncio.shield(turn)
        except BaseException:  # cancelled (the server stops): bytes reserved for it go back
            self._leave(size, turn)
            raise
        if turn.done() and not turn.cancelled():
            return True  # its turn came, even as its time ran out: the bytes are reserved for it
        self._leave(size, turn)
        return False

    def _leave(self, size: int, turn: asyncio.Future[None]) -> None:
        """A waiter gives up: bytes already reserved for it go back, and those behind it may now fit."""
        if turn.done() and not turn.cancelled():
            self._give_back(size)
            return
        turn.cancel()
        with contextlib.suppress(ValueError):
            self._waiting.remove((size, turn))
        self._wake()

    def _give_back(self, size: int) -> None:
        self.buffered -= size
        self._wake()

    def _wake(self) -> None:
        """Reserve, oldest first, for the waiters that fit now, and wake them."""
        while self._waiting and self._fits(self._waiting[0][0]):
            size, turn = self._waiting.popleft()
            if not turn.done():  # (a waiter that gave up meanwhile is skipped)
                self.buffered += size
                turn.set_result(None)

    def _hold_more(self, held: list[int], size: int) -> None:
        """Count ``size`` more body bytes a route made for its request (``held``); 503 past the budget.

        As a chunked body's bytes: counted at once and given back with the rest when the request is
        answered; past ``max_buffered_bytes`` while other requests hold bodies, :class:`Unavailable`.
        """
        others = self.buffered - held[0]
        held[0] += size
        self.buffered += size
        if self.max_buffered_bytes is not None and others > 0 and self.buffered > self.max_buffered_bytes:
            raise Unavailable(self._budget_message(held[0]), retry_after=self.retry_after)

    def _budget_message(self, own: int | None = None) -> str:
        """Why the budget refused a request; ``own``: the bytes it holds, counted in ``buffered`` (else none)."""
        holds = (
            f"this worker holds {self.buffered:,} bytes of request bodies"
            if own is None
            else f"with its {own:,} bytes, this worker would hold {self.buffered:,} bytes of request bodies"
        )
        return (
            f"no room for this request's body: {holds}, PATCHSERVE_MAX_BUFFERED_BYTES is "
            f"{self.max_buffered_bytes or 0:,}; retry after {self.retry_after} s"
        )

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, why: str | None = None, *, drain: bool = True
    ) -> None:
        state: dict[str, Any] = scope.setdefault("state", {})
        labels = accounting.inference_labels(scope)
        if labels is not None:
            state["model"], state["version"] = labels
            accounting.count_refused(labels, Unavailable.outcome)
        error = Unavailable(
            why
            or f"this worker already holds {self.max_in_flight} requests (PATCHSERVE_MAX_IN_FLIGHT); "
            f"retry after {self.retry_after} s",
            retry_after=self.retry_after,
        )
        if not drain or not await self._drain(scope, receive):
            error.headers["Connection"] = "close"
        await error_response_for(scope["path"], error, state.get("request_id"))(scope, receive, send)

    async def _drain(self, scope: Scope, receive: Receive) -> bool:
        """Read and drop a refused request's body, within bounds; whether all of it was read."""
        headers = dict(scope.get("headers", []))
        return await drain_body(receive, headers, self.drain_bytes, min(DRAIN_SECONDS, self.body_timeout))

    def _with_deadline(
        self,
        receive: Receive,
        state: dict[str, Any] | None = None,
        held: list[int] | None = None,
        arrived: float | None = None,
    ) -> Receive:
        """``receive`` that raises :class:`BodyTimeout` once the body is late; unbounded after it.

        ``state["body_done"]`` (the request's state) says whether the whole body has been received.
        ``held[0]``, the body bytes the request holds of the worker's budget, grows as more than it
        declared arrives; past the budget, :class:`Unavailable` (503; the rest of the body read and
        dropped first, within bounds, else ``Connection: close``). Bytes a
        route reads only to drop them (``state[BODY_DROPPED]``, its 413's drain) are not counted.
        """
        deadline = (time.monotonic() if arrived is None else arrived) + self.body_timeout
        body_done = False
        state = {} if state is None else state
        state["body_done"] = False
        held = [0] if held is None else held
        received = 0

        async def receive_before_deadline() -> Message:
            nonlocal body_done, received
            if body_done:
                return await receive()  # e.g. waiting for a disconnect while streaming: no deadline
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(
                    f"the request body was not received within {self.body_timeout:g} s (PATCHSERVE_BODY_TIMEOUT)",
                    headers={"Connection": "close"},
                ) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            state["body_done"] = body_done
            if state.get(BODY_DROPPED):
                return message  # read and dropped, never kept: not the budget's
            received += len(message.get("body", b""))
            if received > held[0]:  # a chunked body (or more than declared): counted as it arrives
                try:
                    self._hold_more(held, received - held[0])
                except Unavailable as error:
                    state[BODY_DROPPED] = True
                    if body_done:
                        pass
                    elif _DRAINING_SEND in state:  # the rest is read and dropped before the 503 goes
                        state[_DRAIN_FIRST] = True
                    else:
                        error.headers["Connection"] = "close"
                    raise
            return message

        return receive_before_deadline
