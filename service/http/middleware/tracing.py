"""The tracing middleware: a server span per HTTP request, the current span while the app runs.

What a span records and how it is exported is :mod:`service.core.tracing`; this is only where an
HTTP request enters it. Off (no OTLP endpoint), the app factory does not install it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.tracing import Tracer


class TracingMiddleware:
    """Pure ASGI middleware: a server span per HTTP request (except those ``untraced`` picks).

    The span is the current one while the app runs, so the hooks below parent their spans to
    it; a ``read body`` child spans the first to the last body message received. Install it
    inside the request-id middleware, which sets the id it records.

    Args:
        app: the ASGI app to trace.
        tracer: the :class:`~service.core.tracing.Tracer`.
        untraced: whether an HTTP request is left untraced (its ``scope``): probes and scrapes,
            by default none.
    """

    def __init__(self, app: ASGIApp, *, tracer: Tracer, untraced: Callable[[Scope], bool] | None = None) -> None:
        self.app = app
        self.tracer = tracer
        self.untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.untraced is not None and self.untraced(scope)):
            await self.app(scope, receive, send)
            return
        from opentelemetry import context

        span, span_context = self.tracer.start_request(scope)
        status: int | None = None
        body_started: int | None = None
        body_done = False

        async def receive_timed() -> Message:
            nonlocal body_started, body_done
            if body_started is None:
                body_started = time.time_ns()
            message = await receive()
            if not body_done and message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
                self.tracer.record("read body", span_context, body_started, time.time_ns())
            return message

        async def send_noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = context.attach(span_context)
        error: BaseException | None = None
        try:
            await self.app(scope, receive_timed, send_noted)
        except BaseException as exc:
            error = exc
            raise
        finally:
            context.detach(token)
            self.tracer.finish_request(span, scope, status, error)
