"""The access log: one structured line per HTTP request (logger ``patchserve.access``).

:class:`AccessLogMiddleware` writes method, path, status, request id, model, version, the batch
size(s) its images ran in, and the ``Server-Timing`` figures (decode, queue, compute, total, in
milliseconds). It replaces uvicorn's access log. Probes and scrapes (``/healthz``, ``/readyz``,
``/metrics``) log at debug level. The line's format (text or JSON) is :mod:`service.core.logs`'.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.logs import ACCESS_LOGGER

QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_TIMING = re.compile(r"([A-Za-z0-9_-]+);dur=([0-9.]+)")


def _timings(header: bytes) -> dict[str, float]:
    """``Server-Timing`` entries in milliseconds: ``{"decode_ms": 0.62, "queue_ms": 2.1, …}``."""
    return {f"{name}_ms": float(ms) for name, ms in _TIMING.findall(header.decode("latin-1")) if name != "total"}


MAX_LOGGED_PATH = 256  # characters of a request path the access log keeps; a client picks its length


_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029]")  # the backslash, C0, DEL, C1, Unicode's line breaks


def logged_path(path: str) -> str:
    """``path`` as the logs write it: control characters escaped, cut to :data:`MAX_LOGGED_PATH`.

    The path is percent-decoded by the server, so ``%0a`` in a URL is a line feed here: written
    raw it would forge a log line (CWE-117). It is written as Python writes it escaped (a line
    feed ``\\n``, a NUL ``\\x00``), and a backslash as two, so no path reads like an escaped
    one; the cut says how many characters were dropped.
    """
    path = _UNSAFE.sub(lambda found: ascii(found.group())[1:-1], path)
    if len(path) <= MAX_LOGGED_PATH:
        return path
    return f"{path[:MAX_LOGGED_PATH]}...(+{len(path) - MAX_LOGGED_PATH} characters)"


class AccessLogMiddleware:
    """Pure ASGI: logs one structured line per HTTP request when its response is done.

    Sits inside the request-id middleware and reads what the layers leave in ``scope["state"]``:
    ``request_id``, and ``model``, ``version`` and ``batch_sizes`` (set by the inference routes
    and by admission). At debug level it also logs ``request received`` as soon as a request
    reaches the app, so a log shows every request the server accepted.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        level = logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO
        response: dict[str, Any] = {"status": None, "timing": b""}

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["timing"] = next((v for k, v in message.get("headers", []) if k == b"server-timing"), b"")
            await send(message)

        rid = state.get("request_id")
        self.log.debug("request received %s %s", scope["method"], logged_path(scope["path"]), extra={"request_id": rid})
        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            if response["status"] is None:
                response["status"] = 500  # what the request-id middleware outside answers for a bug
            raise
        finally:
            if self.log.isEnabledFor(level):
                fields: dict[str, Any] = {
                    "request_id": state.get("request_id"),
                    "method": scope["method"],
                    "path": logged_path(scope["path"]),
                    "status": response["status"],
                    "model": state.get("model"),
                    "version": state.get("version"),
                    "batch_size": state.get("batch_sizes"),
                    **_timings(response["timing"]),
                    "total_ms": round((time.perf_counter() - started) * 1e3, 3),
                }
                fields = {k: v for k, v in fields.items() if v is not None}
                text = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("method", "path"))
                self.log.log(level, "%s %s %s", scope["method"], fields["path"], text, extra=fields)
