"""Request accounting, written once: every inference request is counted with one outcome.

``patchserve_requests_total{model,version,outcome}`` and ``patchserve_request_duration_seconds``
(DESIGN.md, "Metrics") are written only here: by :func:`accounted` around a /v1 or /v2 handler
(success, the outcome of the :class:`~service.core.errors.ProblemError` it raised, or ``error`` for
anything else), and by :func:`count_refused` for a request refused before its handler ran
(admission's 503, a 422 of the query parameters). A client's arbitrary model name never
becomes a label: unknown models and versions are ``("_unknown", "")``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
    has one (every ``ProblemError``: client_error, rejected, timeout, cancelled, error); else
    ``error`` (a bug of ours). The exception is re-raised.
    """
    account = Account(request_state)
    try:
        yield account
    except Exception as exc:
        metrics.observe_request(*account.labels, getattr(exc, "outcome", "error"), account.elapsed())
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
