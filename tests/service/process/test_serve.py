"""The server runner in process: uvicorn settings, the metrics folder, dead workers, the drain's signal handling."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.core import lifecycle
from service.core.metrics import mark_dead_workers
from service.process import serve
from tests.conftest import make_settings


def test_uvicorn_config_defaults_outlast_proxies_and_cover_the_drain() -> None:
    config = serve.uvicorn_config(make_settings())
    assert config.timeout_keep_alive == 75  # above the 60 s idle timeout of common proxies and balancers
    assert config.timeout_graceful_shutdown == 30 and config.drain_delay == 5.0
    assert config.access_log is False  # service.http.middleware.access_log writes the one line per request
    assert config.factory and config.app == "service.http.app:build_app"
    custom = serve.uvicorn_config(make_settings(keep_alive_timeout=620, drain_delay=0, workers=3))
    assert (custom.timeout_keep_alive, custom.drain_delay, custom.workers) == (620, 0.0, 3)


def test_the_metrics_folder_is_wiped_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"old")
    (tmp_path / "ready-4242").write_text("")  # a worker of the last run: its pid may be reused
    (tmp_path / "model-control.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not ours")
    monkeypatch.setenv(serve.MULTIPROC_ENV, str(tmp_path))
    folder, created = serve.prepare_multiprocess_dir()
    assert (folder, created) == (tmp_path, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # only the server's own files go

    monkeypatch.delenv(serve.MULTIPROC_ENV)
    folder, created = serve.prepare_multiprocess_dir()
    try:
        assert created and folder.is_dir() and os.environ[serve.MULTIPROC_ENV] == str(folder)
    finally:
        monkeypatch.delenv(serve.MULTIPROC_ENV)
        folder.rmdir()


def test_dead_workers_lose_their_live_gauges_but_keep_their_counts(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # exited and reaped: its pid is free
    alive = os.getppid()
    for name in (f"gauge_livesum_{dead.pid}.db", f"counter_{dead.pid}.db", f"gauge_livesum_{alive}.db"):
        (tmp_path / name).write_bytes(b"")
    assert mark_dead_workers(tmp_path) == [dead.pid]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"counter_{dead.pid}.db", f"gauge_livesum_{alive}.db"])


def test_a_dead_workers_model_info_and_settings_are_dropped(tmp_path: Path) -> None:
    # Found by an ops tester: with "max" gauges a worker killed while serving version 1 kept
    # patchserve_model_info{version="1"} at 1 after its replacement had retired it; live gauges
    # ("livemax") go with the worker.
    worker = (
        "from service.core import metrics\n"
        "metrics.MODEL_INFO.labels('m', '1', 'classification', 'CPUExecutionProvider').set(1)\n"
        "metrics.MODEL_SETTING.labels('m', '1', 'instances').set(2)\n"
        "metrics.AUTOTUNE_THROUGHPUT.labels('m', '1', '1', '4').set(90.0)\n"
    )
    environment = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", worker], env=environment, check=True, cwd=Path(__file__).parents[3])

    def exported() -> str:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
        return generate_latest(registry).decode()

    assert 'patchserve_model_info{model="m"' in exported()  # while it is not known to be dead
    assert len(mark_dead_workers(tmp_path)) == 1
    text = exported()
    assert 'model="m"' not in text, text


def test_first_sigterm_drains_repeats_are_ignored_and_the_delay_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]  # the drain's clock, moved by the test: a busy machine cannot end the delay early
    monkeypatch.setattr(serve, "time", SimpleNamespace(monotonic=lambda: now[0]))
    server = serve.DrainingServer(serve.uvicorn_config(make_settings(drain_delay=0.2)))
    try:
        server.handle_exit(signal.SIGTERM, None)
        assert lifecycle.shutdown_requested() and not server.should_exit  # 503 on /readyz, still accepting
        server.handle_exit(signal.SIGTERM, None)  # from systemd, timeout(1) or the supervisor: no change
        assert not server.should_exit
        now[0] += 0.1  # half the delay
        assert asyncio.run(server.on_tick(1)) is False
        now[0] += 0.15  # past its end
        assert asyncio.run(server.on_tick(2)) is True and server.should_exit  # stop accepting now
        assert server._captured_signals == []  # nothing re-raised after shutdown: exit status 0
    finally:
        lifecycle.clear_shutdown()


def test_ctrl_c_twice_skips_the_delay_and_three_times_abandons_the_requests() -> None:
    server = serve.DrainingServer(serve.uvicorn_config(make_settings(drain_delay=60)))
    try:
        server.handle_exit(signal.SIGINT, None)
        assert not server.should_exit
        server.handle_exit(signal.SIGINT, None)
        assert server.should_exit and not server.force_exit
        server.handle_exit(signal.SIGINT, None)
        assert server.force_exit
    finally:
        lifecycle.clear_shutdown()


def test_readiness_turns_503_when_the_process_is_asked_to_stop() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from service.http.state import ServerState

    state = ServerState(make_settings(), ThreadPoolExecutor(1), ThreadPoolExecutor(1))
    state.repository = type("Empty", (), {"all": staticmethod(list)})()  # loaded, nothing unready
    assert state.not_ready_reasons() == []
    lifecycle.request_shutdown()
    try:
        assert state.not_ready_reasons() == ["the server is draining (shutting down)"]
    finally:
        lifecycle.clear_shutdown()
        state.decode_pool.shutdown()


def test_uvicorn_runs_uvloop_and_httptools_with_the_backlog_setting() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from service.process import serve
    from tests.conftest import make_settings

    config = serve.uvicorn_config(
        make_settings(backlog=4096, send_timeout=7.5, header_timeout=3.0, max_header_bytes=2048)
    )
    protocol = "service.process.connections:BoundedProtocol"
    assert (config.loop, config.http, config.backlog) == ("uvloop", protocol, 4096)
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol) and config.send_timeout == 7.5
    assert (config.header_timeout, config.max_header_bytes) == (3.0, 2048)
    assert serve.uvicorn_config(make_settings()).backlog == 2048


def test_a_taken_port_stops_the_start_at_once_saying_so(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path) -> None:
    # Found by a fresh user: the models loaded, "ready: ..." was logged, and only then did the bind fail.
    import socket

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server was built although its port was taken")

    monkeypatch.setattr(serve, "DrainingServer", never)
    monkeypatch.setenv(serve.MULTIPROC_ENV, str(tmp_path))  # run() sets it; restored after the test
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for workers in (1, 2):
            assert serve.run(make_settings(host="127.0.0.1", port=port, workers=workers)) == serve.STARTUP_FAILURE
            err = capsys.readouterr().err
            assert f"patchserve: cannot start: cannot listen on 127.0.0.1:{port}: address already in use" in err
    serve.check_can_listen("127.0.0.1", 0)  # a free port: no error
    with pytest.raises(OSError, match=r"cannot listen on 300\.1\.1\.1:80"):
        serve.check_can_listen("300.1.1.1", 80)
