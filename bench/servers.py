"""The HTTP servers under test, each started as a child process on a free loopback port.

Every server runs in a session of its own, so stopping it ends the process group it made
(LitServe's inference workers included) and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from service import tasks
from service.tasks import classification

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Server:
    """How to start one contestant and where to post to it.

    Attributes:
        key: short name in results ("patchserve", "patchserve-no-batching", "naive", "litserve").
        label: the issue's letter and a description, for tables and plots.
        argv: the command, with ``{port}`` where the port goes.
        path: the inference route (``{model}`` is replaced by the model name).
        ready_path: a GET that answers 200 once the server can serve.
        env: extra environment variables.
    """

    key: str
    label: str
    argv: tuple[str, ...]
    path: str
    ready_path: str
    env: Mapping[str, str] = field(default_factory=dict)


def patchserve(
    repository: Path,
    model: str,
    *,
    task: str = classification.TASK.name,
    key: str = "patchserve",
    label: str = "(c) patchserve",
    **settings: str,
) -> Server:
    """patchserve (``python -m service``) serving ``repository``, posted to ``model``'s route.

    ``settings``: ``PATCHSERVE_*`` values by lower-case name, e.g. ``max_batch_size="1"``.
    """
    env = {"PATCHSERVE_MODEL_REPOSITORY": str(repository), "PATCHSERVE_LOG_LEVEL": "warning"}
    env |= {f"PATCHSERVE_{name.upper()}": value for name, value in settings.items()}
    route = tasks.get(task).verb  # POST /v1/models/{model}/{verb}
    return Server(key, label, (sys.executable, "-m", "service"), f"/v1/models/{model}/{route}", "/readyz", env)


def contestants(repository: Path, model: str, version: str = "1") -> list[Server]:
    """(c) patchserve, (d) patchserve without batching, (e) the naive endpoint, (f) LitServe, for one classifier."""
    python = sys.executable
    model_dir = repository / model / version
    return [
        patchserve(repository, model),
        patchserve(
            repository,
            model,
            key="patchserve-no-batching",
            label="(d) patchserve, max_batch_size 1",
            max_batch_size="1",
        ),
        Server(
            "naive",
            "(e) naive FastAPI endpoint",
            (
                python,
                "-m",
                "uvicorn",
                "bench.naive_app:app",
                "--host",
                HOST,
                "--port",
                "{port}",
                "--log-level",
                "warning",
            ),
            "/predict",
            "/healthz",
            {"PATCHSERVE_BENCH_MODEL": str(model_dir)},
        ),
        Server(
            "litserve",
            "(f) LitServe, batching on",
            (python, "-m", "bench.litserve_app", "--model", str(model_dir), "--port", "{port}"),
            "/predict",
            "/health",
        ),
    ]


def echo() -> Server:
    """The HTTP-cost endpoint (bench/echo_app.py): uvicorn with uvloop and httptools, as patchserve runs."""
    argv = (sys.executable, "-m", "uvicorn", "bench.echo_app:app", "--host", HOST, "--port", "{port}",
            "--loop", "uvloop", "--http", "httptools", "--log-level", "warning", "--no-access-log")  # fmt: skip
    return Server("echo", "HTTP alone (reads the body, fixed JSON)", argv, "/echo", "/healthz")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Running:
    """A started server: its base URL and process."""

    server: Server
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def pause(self) -> None:
        """SIGSTOP the server's whole process group: it takes no CPU until :meth:`resume`."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group :meth:`pause` stopped."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the server's whole process group; SIGKILL after ``grace`` seconds."""
        if self.process.poll() is None:
            self.resume()  # a paused server could not act on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        with contextlib.suppress(ProcessLookupError):  # LitServe's workers may outlive their parent
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start(server: Server, log_dir: Path, *, timeout: float = 180.0) -> Running:
    """Start ``server`` and wait until its ready path answers 200.

    Raises:
        RuntimeError: it exited or was not ready within ``timeout`` seconds (its log is named).
    """
    port = free_port()
    env = {**os.environ, "PATCHSERVE_HOST": HOST, "PATCHSERVE_PORT": str(port), **server.env}
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{server.key}.log"
    argv = [part.replace("{port}", str(port)) for part in server.argv]
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = Running(server, port, process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{server.key} exited with status {process.returncode}; see {log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(running.url + server.ready_path, timeout=2).status_code == 200:
                return running
        time.sleep(0.5)
    running.stop()
    raise RuntimeError(f"{server.key} was not ready after {timeout:.0f} s; see {log_path}")


@contextlib.contextmanager
def alone(running: Mapping[str, Running], key: str) -> Iterator[Running]:
    """Pause every server but ``key`` while the block runs (a point is measured), then resume them.

    Servers waiting for their turn are not idle everywhere: LitServe's inference workers poll
    their queues and took 0.17 cores doing nothing (2026-12-03), CPU that the server under test
    lost and the quiet check could not see, being the benchmark's own.
    """
    others = [r for k, r in running.items() if k != key]
    for other in others:
        other.pause()
    try:
        yield running[key]
    finally:
        for other in others:
            other.resume()


@contextlib.contextmanager
def all_running(servers: list[Server], log_dir: Path) -> Iterator[dict[str, Running]]:
    """Start every server (one after another), yield them by key, stop them all at the end."""
    started: dict[str, Running] = {}
    try:
        for server in servers:
            started[server.key] = start(server, log_dir)
        yield started
    finally:
        for running in started.values():
            running.stop()
