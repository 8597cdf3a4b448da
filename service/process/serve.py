"""Running the server: uvicorn worker processes, metrics shared between them, a graceful drain.

Start-up (``python -m service`` -> :func:`run`):

1. ``PROMETHEUS_MULTIPROC_DIR`` is set (a new temporary folder unless given) and wiped, before
   prometheus_client is imported, so every worker writes its series there and ``/metrics``
   merges them (:mod:`service.core.metrics`).
2. Every manifest is validated; a bad one stops start-up with status 2 before a port is opened.
3. uvicorn runs ``workers`` processes (one in-process when ``workers == 1``) sharing one socket.

Shutdown, on SIGTERM or Ctrl-C, in each worker (the supervisor forwards the signal):

1. at once: ``/readyz`` answers 503, so load balancers and Kubernetes take the instance out;
2. for ``drain_delay`` seconds the worker keeps accepting and serving as usual, so clients
   that have not yet seen the 503 are served rather than refused;
3. then it stops accepting, closes idle keep-alive connections, lets every request it has
   received finish (up to ``graceful_shutdown_timeout`` seconds), stops its batchers, and the
   process exits with status 0.

Repeated SIGTERMs change nothing (systemd, ``timeout`` and the supervisor may each send one);
a second Ctrl-C skips the rest of the drain delay, a third abandons the requests in flight.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.supervisors import multiprocess

from service.core.errors import RepositoryError
from service.core.lifecycle import request_shutdown
from service.core.logs import log_config
from service.core.settings import Settings
from service.process.connections import PROTOCOL
from service.runtime.worker_readiness import PREFIX as READY_PREFIX  # imports no prometheus_client

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STARTUP_FAILURE = 3  # uvicorn's status when a worker cannot start


def prepare_multiprocess_dir() -> tuple[Path, bool]:
    """Turn prometheus_client's multiprocess mode on for this process and its workers.

    Uses ``$PROMETHEUS_MULTIPROC_DIR`` if set, else a new folder under the temporary directory
    (a tmpfs in the container). The ``*.db`` files an earlier run left there are removed, so
    counts start at zero with every start, and so are the workers' model-control signal
    (:mod:`service.runtime.control_signal`) and readiness marks
    (:mod:`service.runtime.worker_readiness`). Must run before prometheus_client is imported.

    Returns:
        The folder, and whether it was created here (and so is removed at exit).
    """
    given = os.environ.get(MULTIPROC_ENV)
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="patchserve-metrics-"))
    folder.mkdir(parents=True, exist_ok=True)
    # and the workers' control signal, and their readiness marks (a pid of the last run may be reused)
    for stale in [*folder.glob("*.db"), *folder.glob("model-control.*"), *folder.glob(f"{READY_PREFIX}*")]:
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(folder)
    return folder, not given


class ServeConfig(uvicorn.Config):
    """uvicorn's configuration plus ``drain_delay``, ``send_timeout`` and ``header_timeout`` (seconds) and
    ``max_header_bytes``, which travel to spawned workers (all but the first are read by
    :class:`service.process.connections.BoundedProtocol`)."""

    def __init__(
        self,
        app: str,
        *,
        drain_delay: float = 0.0,
        send_timeout: float | None = None,
        header_timeout: float | None = None,
        max_header_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.drain_delay = drain_delay
        self.send_timeout = send_timeout
        self.header_timeout = header_timeout
        self.max_header_bytes = max_header_bytes


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT starts a drain instead of closing at once."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop_accepting_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._stop_accepting_at is None:
            delay = getattr(self.config, "drain_delay", 0.0)
            request_shutdown()
            self._stop_accepting_at = time.monotonic() + delay
            log.info("%s: draining; /readyz is 503, still accepting for %.1f s", signal.Signals(sig).name, delay)
            return
        # Later signals: SIGTERM again changes nothing (systemd, timeout(1) and the supervisor may
        # each send one); SIGINT (Ctrl-C again) stops accepting now, and a third abandons the
        # requests in flight. No signal is re-raised after shutdown (uvicorn's default), so the
        # exit status is 0.
        if sig != signal.SIGINT:
            return
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self._stop_accepting_at is not None and not self.should_exit and time.monotonic() >= self._stop_accepting_at:
            log.info("drain delay over: no longer accepting; finishing the requests received")
            self.should_exit = True
        return await super().on_tick(counter)


class _DrainingProcess(multiprocess.Process):
    """uvicorn's worker process, running a :class:`DrainingServer`."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = DrainingServer(config=self.config)
        return self._server


class _Supervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor, with two changes for the drain.

    * SIGTERM is passed on to the workers at once, from the signal handler, rather than at the
      supervisor's next half-second turn, so every worker's readiness turns 503 immediately
      (the supervisor's own later SIGTERM to them changes nothing).
    * It closes its own copy of the listening socket when shutdown begins. The workers keep
      accepting on their copies through the drain delay; once the last of them closes its
      copy, new connections are refused at once instead of waiting in a backlog that nobody
      accepts from until the supervisor exits.
    """

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        signal.signal(signal.SIGTERM, self._forward_sigterm)

    def _forward_sigterm(self, sig: int, frame: FrameType | None) -> None:
        self.signal_queue.append(sig)
        for process in self.processes:
            if process.pid is not None and process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()


def uvicorn_config(settings: Settings) -> ServeConfig:
    """The uvicorn configuration for ``settings`` (the app is built by ``service.http.app:build_app``)."""
    return ServeConfig(
        "service.http.app:build_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=log_config(settings.log_level, settings.log_format),
        log_level=settings.log_level,
        access_log=False,  # service.http.middleware.access_log writes one structured line per request instead
        loop="uvloop",  # explicit, not "auto": both come with uvicorn[standard]; asyncio's loop and h11 are slower
        http=PROTOCOL,  # uvicorn's httptools protocol with a send timeout (service/process/connections.py)
        backlog=settings.backlog,
        timeout_keep_alive=settings.keep_alive_timeout,
        timeout_graceful_shutdown=settings.graceful_shutdown_timeout,
        drain_delay=settings.drain_delay,
        send_timeout=settings.send_timeout,
        header_timeout=settings.header_timeout,
        max_header_bytes=settings.max_header_bytes,
    )


def check_can_listen(host: str, port: int) -> None:
    """Bind, then close, a socket on every address ``host`` resolves to (all of them for ``""``), as
    asyncio's ``create_server`` will bind when uvicorn starts, so a taken port or a bad host stops
    the start before the models load. uvicorn binds after its lifespan (one worker): without this
    check the models loaded, "ready" was logged, and only then did the bind fail.

    Raises:
        OSError: "cannot listen on 127.0.0.1:8000: address already in use" (or why it cannot).
    """
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as create_server does
                probe.bind(address)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise OSError(f"cannot listen on {host}:{port}: {reason}") from None


def run(settings: Settings) -> int:
    """Serve until a signal has drained the server. Returns the process exit status.

    Returns:
        0 after a clean shutdown; 2 when the repository or a manifest is invalid (nothing was
        started); 3 when the server could not start.
    """
    try:
        folder, created = prepare_multiprocess_dir()
    except OSError as exc:  # e.g. the variable names a file, or a folder that cannot be made
        print(f"patchserve: cannot start: {MULTIPROC_ENV}={os.environ.get(MULTIPROC_ENV)!r}: {exc}", file=sys.stderr)
        return 2
    try:
        from service.http.app import validate_repository  # imports prometheus_client: after the folder is set

        try:
            validate_repository(settings)
        except RepositoryError as exc:
            print(f"patchserve: cannot start: {exc}", file=sys.stderr)
            return 2
        config = uvicorn_config(settings)
        try:  # before the models load: a taken port fails at once, not after a "ready" line
            check_can_listen(settings.host, settings.port)
        except OSError as exc:
            print(f"patchserve: cannot start: {exc}", file=sys.stderr)
            return STARTUP_FAILURE
        if settings.workers == 1:
            server = DrainingServer(config)
            server.run()
            return 0 if server.started else STARTUP_FAILURE
        # uvicorn's supervisor makes its workers from this module-level name; give it ours.
        multiprocess.Process = _DrainingProcess  # type: ignore[misc]
        supervisor = _Supervisor(config, sockets=[config.bind_socket()])
        supervisor.run()
        return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0
    finally:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
