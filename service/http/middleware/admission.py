"""Admission: what a worker lets in, before any body is kept or any image decoded (DESIGN.md, "Receive").

Two limits, both answered as problem+json (on /v2 as the protocol's ``{"error": ...}``):

* **Requests in flight.** Each worker holds at most ``max_in_flight`` requests at once; one more
  is refused with 503 and ``Retry-After`` before it runs, its body never kept, so a burst
  cannot pile up uploads, decoded images or queued tensors in memory. Liveness, readiness and
  metrics (``/healthz``, ``/readyz``, ``/metrics``) are never refused: a busy server stays
  observable and is not restarted for being busy. Behind this cap the batcher's bounded queue
  (503) and request deadlines (504) apply. The refused request's body is read and dropped
  (never kept: one chunk at a time, at most ``drain_bytes`` and :data:`DRAIN_SECONDS`) before
  the 503 is sent: a client that writes its whole body before reading its answer (most HTTP
  libraries, with ``Connection: close``) would otherwise get a TCP reset, the kernel's answer to
  a socket closed with unread data, instead of the 503 (nginx's "lingering close" for the same
  reason). A body that does not arrive within that bound, or a client that waits for
  ``100 Continue``, gets the 503 at once with ``Connection: close``.
* **Body-read time.** The whole body must arrive within ``body_timeout`` seconds of the request's
  arrival, else 408 and the connection is closed (a slow or stalled upload cannot hold a slot).

Refusals are counted in ``patchserve_requests_total{outcome="rejected"}`` under the model the
path names (``_unknown`` when there is no such model).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import BodyTimeout, Unavailable
from service.http import accounting
from service.http.lifetime import drain_body
from service.http.problems import error_response_for

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Most seconds a refused request's body is read for (and the body timeout): a 17 MB upload among
# 200 took ~10 s to arrive on a loaded 2-core machine, and 5 s turned most such 503s into resets.
DRAIN_SECONDS = 30.0
# Reads are bounded with asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for with a timeout
# of 0 cancels a read before it runs (a body that had long arrived got a 408 when the app reached it
# late), and wait_for can swallow a cancellation that arrives as the read completes, losing an outer
# deadline (service.http.lifetime.body_by_deadline). A read that does not have to wait returns at once.


class AdmissionMiddleware:
    """Pure ASGI middleware: the in-flight cap (503) and the body-read timeout (408) of one worker.

    Args:
        app: the ASGI application behind it.
        max_in_flight: most requests (exempt paths aside) this worker holds at once.
        body_timeout: seconds from a request's arrival to the end of its body.
        retry_after: the ``Retry-After`` of a refusal, in seconds.
        exempt: paths that are never refused and have no body timeout.
        drain_bytes: most body bytes read and dropped before a refusal is sent (the body cap).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        body_timeout: float,
        retry_after: int = 1,
        exempt: frozenset[str] = EXEMPT_PATHS,
        drain_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.drain_bytes = drain_bytes
        self.max_in_flight = max_in_flight
        self.body_timeout = body_timeout
        self.retry_after = retry_after
        self.exempt = exempt
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await self._refuse(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, self._with_deadline(receive, scope.setdefault("state", {})), send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: dict[str, Any] = scope.setdefault("state", {})
        labels = accounting.inference_labels(scope)
        if labels is not None:
            state["model"], state["version"] = labels
            accounting.count_refused(labels, Unavailable.outcome)
        error = Unavailable(
            f"this worker already holds {self.max_in_flight} requests (PATCHSERVE_MAX_IN_FLIGHT); "
            f"retry after {self.retry_after} s",
            retry_after=self.retry_after,
        )
        if not await self._drain(scope, receive):
            error.headers["Connection"] = "close"
        await error_response_for(scope["path"], error, state.get("request_id"))(scope, receive, send)

    async def _drain(self, scope: Scope, receive: Receive) -> bool:
        """Read and drop a refused request's body, within bounds; whether all of it was read."""
        headers = dict(scope.get("headers", []))
        return await drain_body(receive, headers, self.drain_bytes, min(DRAIN_SECONDS, self.body_timeout))

    def _with_deadline(self, receive: Receive, state: dict[str, Any] | None = None) -> Receive:
        """``receive`` that raises :class:`BodyTimeout` once the body is late; unbounded after it.

        ``state["body_done"]`` (the request's state) says whether the whole body has been received.
        """
        deadline = time.monotonic() + self.body_timeout
        body_done = False
        state = {} if state is None else state
        state["body_done"] = False

        async def receive_before_deadline() -> Message:
            nonlocal body_done
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
            return message

        return receive_before_deadline
