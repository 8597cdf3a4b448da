"""The process's shutdown flag: set by the entry point's signal handler, read by readiness and loading.

:class:`service.process.serve.DrainingServer` sets it on the first SIGTERM or SIGINT;
:meth:`service.http.state.ServerState.not_ready_reasons` reads it, so ``/readyz`` turns 503 at
once while the server keeps answering during its drain; start-up's loading and the auto-tuner
stop at their next step (:class:`StartupStopped`), so a signal during start-up is obeyed within
the drain, not after every model has been tuned and warmed up. It lives at the bottom so that the
HTTP layer reads it without importing the entry point that builds the HTTP app.
"""

from __future__ import annotations

import threading

_shutdown = threading.Event()


def request_shutdown() -> None:
    """Mark this process as shutting down (idempotent)."""
    _shutdown.set()


def clear_shutdown() -> None:
    """Forget a shutdown request (tests that run several drains in one process)."""
    _shutdown.clear()


def shutdown_requested() -> bool:
    """True once this process received SIGTERM or SIGINT (readiness turns 503)."""
    return _shutdown.is_set()


class StartupStopped(Exception):
    """Start-up's loading (or the auto-tuner's measurement) stopped because the process is shutting down."""


def stop_if_shutting_down() -> None:
    """Raise :class:`StartupStopped` once a shutdown was requested (a step of loading or tuning starts)."""
    if _shutdown.is_set():
        raise StartupStopped("shutting down: loading the models stopped")
