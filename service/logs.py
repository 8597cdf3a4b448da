"""Logging: one configuration for every worker process, and one structured line per request.

``PATCHSERVE_LOG_FORMAT=text`` writes ``time level logger [pid] message``; ``json`` writes one
JSON object per line with the same fields plus every structured field of the record (for
Loki, CloudWatch, Elasticsearch …). The configuration is a :func:`logging.config.dictConfig`
dictionary handed to uvicorn, which applies it in the supervisor and again in each worker it
spawns, so a worker's lines look like the supervisor's.

:class:`AccessLogMiddleware` writes the per-request line (logger ``patchserve.access``): method,
path, status, request id, model, version, the batch size(s) its images ran in, and the
``Server-Timing`` figures (decode, queue, compute, total, in milliseconds). It replaces uvicorn's
access log. Probes and scrapes (``/healthz``, ``/readyz``, ``/metrics``) log at debug level.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "patchserve.access"
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_TIMING = re.compile(r"([A-Za-z0-9_-]+);dur=([0-9.]+)")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, pid, message, extras."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        document.update((k, v) for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k != "color_message")
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def log_config(level: str, fmt: str) -> dict[str, Any]:
    """The :func:`logging.config.dictConfig` dictionary for ``level`` and ``fmt`` ("text" | "json")."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"},
            "json": {"()": JsonFormatter},
        },
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": fmt, "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
            "PIL": {"level": "INFO"},  # its debug lines describe every image chunk decoded
        },
    }


def _timings(header: bytes) -> dict[str, float]:
    """``Server-Timing`` entries in milliseconds: ``{"decode_ms": 0.62, "queue_ms": 2.1, …}``."""
    return {f"{name}_ms": float(ms) for name, ms in _TIMING.findall(header.decode("latin-1")) if name != "total"}


MAX_LOGGED_PATH = 256  # characters of a request path the access log keeps; a client picks its length


def logged_path(path: str) -> str:
    """``path`` as the access log writes it: cut to :data:`MAX_LOGGED_PATH` characters, saying how many were dropped."""
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
