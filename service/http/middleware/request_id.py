"""The request id and the whole request's timing: the outermost middleware, and the last resort for a bug's 500."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core import lifecycle
from service.core.errors import Unavailable
from service.http.problems import error_response_for, problem_response, unexpected
from service.http.responses import server_timing

log = logging.getLogger(__name__)

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class RequestIdMiddleware:
    """Gives every HTTP request an id and times it.

    The client's ``X-Request-ID`` is kept when it is 1-128 characters of ``[A-Za-z0-9._:-]``,
    else a new one is made. The id is stored in ``request.state.request_id`` (problems use it
    as their ``instance``), echoed in the response's ``X-Request-ID``, and the whole request's
    duration is appended to ``Server-Timing`` as ``total;dur=<ms>``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        client_id = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = client_id if _CLIENT_ID.match(client_id) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"server-timing"]
                timing = next((v for k, v in message.get("headers", []) if k == b"server-timing"), b"")
                total = server_timing(total=time.perf_counter() - started).encode()
                headers.append((b"server-timing", timing + b", " + total if timing else total))
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        started_response = False

        async def send_tracking(message: Message) -> None:
            nonlocal started_response
            started_response = started_response or message["type"] == "http.response.start"
            await send_with_id(message)

        try:
            await self.app(scope, receive, send_tracking)
        except asyncio.CancelledError:
            if not lifecycle.shutdown_requested():
                raise
            # uvicorn cancels what is still running at PATCHSERVE_GRACEFUL_SHUTDOWN_TIMEOUT: answer 503
            # where nothing was sent yet (else the client read a broken pipe, and the log a traceback)
            log.warning("request %s abandoned: the graceful shutdown timeout passed", rid)
            if not started_response:
                error = Unavailable("the server shut down before this request was done; retry", retry_after=1)
                error.headers["Connection"] = "close"
                await error_response_for(scope["path"], error, rid)(scope, receive, send_with_id)
        except Exception as exc:
            # A bug of ours: answer with a problem carrying this request's id and timing (the
            # outermost error handler would answer without them), or, if the response had
            # already started, let the server close the connection.
            if started_response:
                log.exception("unhandled error in request %s", rid)
                raise
            response = problem_response(unexpected(exc, f"request {rid}"), rid)
            await response(scope, receive, send_with_id)
