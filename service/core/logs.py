"""Logging: one configuration for every worker process, text or JSON lines.

``PATCHSERVE_LOG_FORMAT=text`` writes ``time level logger [pid] message``; ``json`` writes one
JSON object per line with the same fields plus every structured field of the record (for
Loki, CloudWatch, Elasticsearch …). The configuration is a :func:`logging.config.dictConfig`
dictionary handed to uvicorn, which applies it in the supervisor and again in each worker it
spawns, so a worker's lines look like the supervisor's.

Python warnings (numpy's, FastAPI's) are routed through logging (logger ``py.warnings``, level
WARNING) wherever this configuration is applied, so in JSON mode they are JSON lines too, not the
multi-line text :mod:`warnings` writes to stderr. What a client's bytes make libraries say is
written at DEBUG, shown only with ``PATCHSERVE_LOG_LEVEL=debug``, so that a bad upload cannot set
off an operator's alerts on ERROR or WARNING lines (:class:`ClientFaults`): Pillow's records and
warnings in a decode thread ("Corrupt EXIF data", "More samples per pixel than can be decoded"),
about a client's file that its answer already names (a 4xx, or a 200 when it decoded anyway), and
uvicorn's "Invalid HTTP request received.", which the connection logs at INFO with the client and
the reason (:mod:`service.process.connections`). Pillow's words elsewhere (a codec that failed to
load at start, a font feature missing while a picture is drawn) keep their level.

The per-request line (logger :data:`ACCESS_LOGGER`) is written by
:class:`service.http.middleware.access_log.AccessLogMiddleware`.
"""

from __future__ import annotations

import json
import logging
import os
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


_PIL_SOURCE = f"{os.sep}PIL{os.sep}"  # in a warning's text: the file of Pillow that warned
DECODE_THREADS = "decode"  # the decode pool's thread names begin so (service.http.app): they read clients' files
_UNPARSED = "Invalid HTTP request received."  # uvicorn's warning for bytes httptools refused


class ClientFaults(logging.Filter):
    """What a client's bytes make libraries log, moved to DEBUG (and dropped above it).

    Pillow's records (logger ``PIL.*``) and warnings (``py.warnings`` from a ``PIL/`` file) in a
    thread named :data:`DECODE_THREADS`, and uvicorn's :data:`_UNPARSED` warning.

    Args:
        level: the configured level's name ("INFO").
    """

    def __init__(self, level: str) -> None:
        super().__init__()
        self.level = logging.getLevelNamesMapping()[level]

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        pillow = (
            name == "PIL" or name.startswith("PIL.") or (name == "py.warnings" and _PIL_SOURCE in record.getMessage())
        )
        unparsed = name == "uvicorn.error" and record.msg == _UNPARSED
        if (pillow and (record.threadName or "").startswith(DECODE_THREADS)) or unparsed:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.level <= logging.DEBUG
        return True


def capture_warnings(level: str = "INFO") -> logging.Filter:
    """Route :mod:`warnings` through logging; a filter factory, so that ``dictConfig`` calls it.

    uvicorn applies :func:`log_config` in the supervisor and in every worker it spawns, each a
    fresh interpreter: configuring the handler's filter is what reaches every process.

    Args:
        level: the configured level's name ("INFO"), for :class:`ClientFaults`.

    Returns:
        :class:`ClientFaults` for ``level``.
    """
    logging.captureWarnings(True)
    return ClientFaults(level)


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
        "filters": {"warnings": {"()": capture_warnings, "level": level}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": fmt,
                "stream": "ext://sys.stderr",
                "filters": ["warnings"],
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
            "PIL": {"level": "INFO"},  # its debug lines describe every image chunk decoded
            # warns of each malformed multipart body before it raises: the client's 400 says it
            "python_multipart": {"level": "ERROR"},
        },
    }
