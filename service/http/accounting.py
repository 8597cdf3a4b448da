"""Request accounting, written once: every inference request is counted with one outcome.

``patchserve_requests_total{model,version,outcome}`` and ``patchserve_request_duration_seconds``
(DESIGN.md, "Metrics") are written only here: by :func:`accounted` around a /v1 or /v2 handler
(success, the outcome of the :class:`~service.core.errors.ProblemError` it raised, or ``error`` for
anything else), and by :func:`count_refused` for a request refused before its handler ran
(admission's 503, a 422 of the query parameters). A client's arbitrary model name never
becomes a label: unknown models and versions are ``("_unknown", "")``.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs

from starlette.types import Scope

from service import tasks
from service.core import metrics
from service.core.errors import ModelNotFound

UNKNOWN = (metrics.UNKNOWN_MODEL, "")


class Account:
    """The labels and start time of one request being counted (see :func:`accounted`)."""

    def __init__(self, request_state: Any | None) -> None:
        self.labels = UNKNOWN
        self.started = time.perf_counter()
        self._state = request_state

    def model(self, name: str, version: int | str) -> None:
        """The request resolved its model version: label its count (and its access-log line) with it."""
        self.labels = (name, str(version))
        if self._state is not None:
            self._state.model, self._state.version = self.labels

    def elapsed(self) -> float:
        """Seconds since the request's handler started."""
        return time.perf_counter() - self.started


@contextmanager
def accounted(request_state: Any | None = None) -> Iterator[Account]:
    """Count the request handled inside the block, once, with its outcome and duration.

    Args:
        request_state: ``request.state``; :meth:`Account.model` sets its ``model`` and
            ``version`` for the access log.

    Yields:
        The :class:`Account`; call :meth:`Account.model` once the model version is known.

    Outcomes: ``success`` when the block ends normally; the ``outcome`` of an exception that
    has one (every ``ProblemError``: client_error, rejected, timeout, cancelled, error); ``cancelled``
    when its task is cancelled; else ``error`` (a bug of ours). The exception is re-raised.
    """
    account = Account(request_state)
    try:
        yield account
    except Exception as exc:
        metrics.observe_request(*account.labels, getattr(exc, "outcome", "error"), account.elapsed())
        raise
    except asyncio.CancelledError:  # its task cancelled (the graceful shutdown's timeout): never answered
        metrics.observe_request(*account.labels, "cancelled", account.elapsed())
        raise
    metrics.observe_request(*account.labels, "success", account.elapsed())


def labels_for(repository: Any | None, name: str, version: str | None) -> tuple[str, str]:
    """The ``(model, version)`` labels of a request for ``name`` (and ``version``, None: the default).

    ``("_unknown", "")`` when the repository is not loaded or has no such model or version.
    """
    if repository is None:
        return UNKNOWN
    try:
        model = repository.get(name, version)
    except ModelNotFound:
        return UNKNOWN
    return model.name, str(model.version)


def count_refused(labels: tuple[str, str], outcome: str) -> None:
    """Count a request refused before its handler ran (admission's 503, a 422); not timed."""
    metrics.observe_request(*labels, outcome, None)


@functools.cache
def _inference_path(verbs: tuple[str, ...]) -> re.Pattern[str]:
    """/v1/models/{name}/{verb} of every registered task, and the Open Inference Protocol's
    /v2/models/{name}[/versions/{v}]/infer."""
    alternatives = "|".join(re.escape(verb) for verb in (*verbs, "infer"))
    return re.compile(rf"^/v[12]/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/(?:{alternatives})$")


def inference_labels(scope: Scope) -> tuple[str, str] | None:
    """The ``(model, version)`` metric labels an inference path names; None for other paths.

    The version is the path's (``/versions/{v}``) or the query's (``?version=``), else the
    default one. Unknown models and versions give ``("_unknown", "")``, as the routes do.
    """
    match = _inference_path(tuple(tasks.verbs())).match(scope["path"])
    if match is None:
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    version = match["version"] or (query.get("version") or [None])[0]
    app = scope.get("app")
    repository = getattr(getattr(getattr(app, "state", None), "server", None), "repository", None)
    return labels_for(repository, match["name"], version)
