"""Metrics across 4 worker processes: exact counts, a killed worker, promtool, a real Prometheus, Grafana.

One real server (``python -m service``, 4 uvicorn workers, prometheus_client multiprocess mode)
and one real Prometheus server (Debian's ``prometheus`` package, which `make test` installs)
scraping it every second.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port, require_tool, server_process
from tests.service.helpers import sample

pytestmark = pytest.mark.slow
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
CLASSIFY = "/v1/models/vit-digits/classify"
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "patchserve.json"
HOW = "`make test` installs Debian's prometheus package, which ships promtool"
N = 120
REST = 24  # requests sent while the workers that served the others are stopped


def seed_stale_counter(folder: Path) -> None:
    """A counter file as a previous run would leave it (1000 successes): start-up must wipe it."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    stale = MmapedDict(str(folder / "counter_424242.db"))
    key = mmap_key(
        "patchserve_requests",
        "patchserve_requests_total",
        ["model", "version", "outcome"],
        ["vit-digits", "1", "success"],
        "Inference requests answered, by outcome.",
    )
    stale.write_value(key, 1000.0, 0.0)
    stale.close()


def worker_pids(supervisor: int) -> list[int]:
    """The uvicorn worker processes (spawned children) of ``supervisor``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == supervisor and b"spawn_main" in cmdline and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return sorted(pids)


def served_pids(log_path: Path, at_least: int = 0, timeout: float = 10) -> set[int]:
    """The worker processes whose access log shows a 200 for the classify route, once the log
    holds ``at_least`` such lines (a worker logs a request just after answering it)."""
    give_up = time.monotonic() + timeout
    while True:
        lines = [
            json.loads(line)
            for line in log_path.read_text().splitlines()
            if line.startswith("{") and '"status": 200' in line and CLASSIFY in line
        ]
        if len(lines) >= at_least or time.monotonic() > give_up:
            return {line["pid"] for line in lines}
        time.sleep(0.05)


async def post_many(url: str, n: int, concurrency: int) -> list[int]:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(i: int) -> int:
            async with limit:
                while True:  # a worker still loading answers 503 (counted as _unknown, rejected)
                    response = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers={"X-Request-ID": f"n-{i}"})
                    if response.status_code != 503:
                        return response.status_code
                    await asyncio.sleep(0.2)

        return await asyncio.gather(*(one(i) for i in range(n)))


def totals(text: str) -> dict[str, float]:
    return {
        "requests": sample(text, "patchserve_requests_total", model="vit-digits", outcome="success"),
        "durations": sample(text, "patchserve_request_duration_seconds_count", model="vit-digits"),
        "decodes": sample(text, "patchserve_decode_duration_seconds_count", model="vit-digits"),
        "queued": sample(text, "patchserve_queue_duration_seconds_count", model="vit-digits"),
        "batched_images": sample(text, "patchserve_batch_size_sum", model="vit-digits"),
        "queue_depth": sample(text, "patchserve_queue_depth", model="vit-digits"),
        "model_info": sample(text, "patchserve_model_info", model="vit-digits", provider="CPUExecutionProvider"),
    }


@contextmanager
def prometheus(target: str, folder: Path) -> Iterator[str]:
    """A real Prometheus scraping ``target`` every second; yields its base URL."""
    binary = require_tool("prometheus", HOW)
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: patchserve\n    static_configs:\n      - targets: ['{target}']\n"
    )
    log = (folder / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (folder / "prometheus.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def promql(url: str, expr: str) -> list[dict]:
    response = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def promql_until(url: str, expr: str, condition, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = promql(url, expr)
        if condition(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


def wait_until_every_worker_is_ready(log_path: Path, workers: int, timeout: float = 120) -> None:
    """Until ``workers`` processes have logged "ready:" (the server is ready with its first; a worker
    still loading its models takes no connections, so the load would miss it)."""
    give_up = time.monotonic() + timeout
    while True:
        ready = {
            json.loads(line)["pid"]
            for line in log_path.read_text().splitlines()
            if line.startswith("{") and '"message": "ready: ' in line
        }
        if len(ready) >= workers:
            return
        assert time.monotonic() < give_up, f"{len(ready)} of {workers} workers ready after {timeout} s"
        time.sleep(0.2)


def test_counts_are_exact_across_4_workers_and_after_one_is_killed(tmp_path: Path) -> None:
    promtool = require_tool("promtool", HOW)
    metrics_dir = tmp_path / "multiproc"
    metrics_dir.mkdir()
    seed_stale_counter(metrics_dir)
    env = {
        "PATCHSERVE_WORKERS": "4",
        "PATCHSERVE_LOG_FORMAT": "json",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PATCHSERVE_INTRA_OP_THREADS": "1",
        "PATCHSERVE_DECODE_THREADS": "1",
    }
    with server_process(env=env, ready_timeout=120) as (url, process):
        wait_until_every_worker_is_ready(process.log_path, workers=4)
        host_port = url.removeprefix("http://")
        with prometheus(host_port, tmp_path / "prometheus") as prom:
            # Which worker accepts a connection is the kernel's choice (it may give all of them to
            # one). So that several workers serve whatever it chooses: most of the load, then the
            # workers that served it are stopped (SIGSTOP: they cannot accept) and the rest, on new
            # connections, can only go to the others. The rest is small: the supervisor replaces a
            # worker that misses its 5 s health ping, and 24 tiny requests take well under that.
            statuses = asyncio.run(post_many(url, N - REST, concurrency=12))
            first = served_pids(process.log_path, at_least=N - REST)
            stopped = sorted(first)[:3]  # never all four: one must be left to accept
            assert stopped, "no request was logged"
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            try:
                statuses += asyncio.run(post_many(url, REST, concurrency=12))
            finally:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
            assert statuses == [200] * N

            scrapes = [httpx.get(url + "/metrics").text for _ in range(8)]  # 8 scrapes land on several workers
            for text in scrapes:
                assert totals(text) == {
                    "requests": N,  # not N + 1000: the stale file of an earlier run was wiped
                    "durations": N,
                    "decodes": N,
                    "queued": N,
                    "batched_images": N,
                    "queue_depth": 0,
                    "model_info": 1,  # max over workers, not their sum
                }
            check = subprocess.run([promtool, "check", "metrics"], input=scrapes[0], capture_output=True, text=True)
            assert check.returncode == 0 and check.stdout == check.stderr == "", check.stdout + check.stderr

            served_by = served_pids(process.log_path, at_least=N)
            workers = worker_pids(process.pid)
            assert len(workers) == 4 and served_by <= set(workers) and len(served_by) >= 2, (served_by, first, workers)

            victim = max(served_by)
            os.kill(victim, signal.SIGKILL)
            for _ in range(600):  # the supervisor reaps it (and starts a replacement); a bound, never a figure
                if victim not in worker_pids(process.pid):
                    break
                time.sleep(0.1)
            after_kill = [httpx.get(url + "/metrics").text for _ in range(8)]
            for text in after_kill:
                counts = totals(text)
                kept = {k: counts[k] for k in ("requests", "durations", "decodes", "queue_depth", "model_info")}
                assert kept == {"requests": N, "durations": N, "decodes": N, "queue_depth": 0, "model_info": 1}
            assert not list(metrics_dir.glob(f"gauge_live*_{victim}.db"))  # the dead worker's live gauge is dropped
            assert list(metrics_dir.glob(f"counter_{victim}.db"))  # its counts stay

            # The real Prometheus scraped the merged series: a PromQL query returns the exact count.
            expr = 'sum(patchserve_requests_total{model="vit-digits",outcome="success"})'
            result = promql_until(prom, expr, lambda r: r and float(r[0]["value"][1]) == N)
            assert float(result[0]["value"][1]) == N
            up = promql(prom, 'up{job="patchserve"}')
            assert [float(r["value"][1]) for r in up] == [1.0]

            # The supervisor's replacement takes connections while it loads, and answers them 503 until it is
            # ready (a slow VM, 2026-12-07: one of the posts below): wait until it has logged "ready:" too.
            wait_until_every_worker_is_ready(process.log_path, workers=5)  # the first 4 and the replacement
            # Errors and more traffic, so that every Grafana panel has something to show.
            with httpx.Client(base_url=url, timeout=30) as client:
                for _ in range(5):
                    assert client.post(CLASSIFY, files={"image": b"not an image"}).status_code == 415
                    assert client.post("/v1/models/nope/classify", files={"image": DIGIT_7}).status_code == 404
                    assert client.post(CLASSIFY, files=[("image", DIGIT_7)] * 4).status_code == 200
            errors = 'sum(patchserve_requests_total{outcome="client_error"})'
            promql_until(prom, errors, lambda r: r and float(r[0]["value"][1]) == 10)

            def without_data() -> list[tuple[str, str]]:
                queries = dashboard_queries()
                return [(title, e) for title, e in queries if not promql(prom, e.replace("$__rate_interval", "1m"))]

            # rate() needs two scrapes of the new series: wait for them (a busy Prometheus may scrape
            # late), a bound on waiting, never a measured figure
            give_up = time.monotonic() + 60
            while (empty := without_data()) and time.monotonic() < give_up:
                time.sleep(0.5)
            assert not empty, f"dashboard queries with no data: {empty}"
