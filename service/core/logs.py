"""Logging: one configuration for every worker process, text or JSON lines.

``PATCHSERVE_LOG_FORMAT=text`` writes ``time level logger [pid] message``; ``json`` writes one
JSON object per line with the same fields plus every structured field of the record (for
Loki, CloudWatch, Elasticsearch …). The configuration is a :func:`logging.config.dictConfig`
dictionary handed to uvicorn, which applies it in the supervisor and again in each worker it
spawns, so a worker's lines look like the supervisor's.

The per-request line (logger :data:`ACCESS_LOGGER`) is written by
:class:`service.http.middleware.access_log.AccessLogMiddleware`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

ACCESS_LOGGER = "patchserve.access"
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


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
