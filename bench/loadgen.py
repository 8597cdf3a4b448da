"""The load generator: wrk, posting real JPEG files as multipart at a fixed concurrency.

Why wrk: the load generator shares the 2 cores with the server it measures, so it must cost
next to nothing. wrk (C, epoll, Debian package ``wrk``) sends pre-built requests from one
thread at a small fraction of a core, keeps exactly ``-c`` requests in flight (closed loop,
one per connection), records every latency in an HdrHistogram, and its Lua hooks build the
multipart bodies once and print the summary as JSON (``bench/multipart.lua``). An asyncio
client in Python (httpx) would spend a large share of a core on its own event loop at these
rates and skew the figures it reports; hey is Go and fine, but has no per-request body
rotation over many files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

SCRIPT = Path(__file__).with_name("multipart.lua")


class LoadGeneratorMissing(RuntimeError):
    """wrk is not installed."""


@dataclass(frozen=True)
class LoadResult:
    """One wrk run.

    Attributes:
        concurrency: requests kept in flight (connections).
        seconds: measured duration.
        requests: responses received (any status).
        throughput: successful responses per second (non-2xx/3xx and socket errors excluded).
        p50_ms, p90_ms, p99_ms, max_ms, mean_ms: latency of responses received, in milliseconds.
        errors: non-2xx/3xx responses plus connect, read, write errors and timeouts.
        error_detail: wrk's error counters.
    """

    concurrency: int
    seconds: float
    requests: int
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: int
    error_detail: dict[str, int]

    def to_dict(self) -> dict:
        return asdict(self)


def wrk_version() -> str:
    """wrk's version line, e.g. "wrk debian/4.1.0-3+b2 [epoll]"."""
    executable = _wrk()
    done = subprocess.run([executable, "--version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).splitlines()[0].split(" Copyright")[0]


def _wrk() -> str:
    executable = shutil.which("wrk")
    if executable is None:
        raise LoadGeneratorMissing("wrk is not installed: `apt-get install wrk` (make bench does it when run as root)")
    return executable


def run(
    url: str,
    files: Sequence[Path],
    *,
    concurrency: int,
    seconds: float,
    field: str = "image",
    timeout: float = 60.0,
) -> LoadResult:
    """Post ``files`` (cycled) to ``url`` from ``concurrency`` connections for ``seconds``.

    Raises:
        LoadGeneratorMissing: wrk is not installed.
        RuntimeError: wrk failed or printed no result.
    """
    argv = [
        _wrk(),
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(seconds))}s",
        f"--timeout={round(timeout)}s",
        "-s",
        str(SCRIPT),
        url,
        "--",
        field,
        *map(str, files),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    summary = json.loads(line.removeprefix("WRK_JSON "))
    errors = summary["errors"]
    failed = sum(errors.values())
    elapsed = summary["duration_us"] / 1e6
    latency = summary["latency_us"]
    return LoadResult(
        concurrency=concurrency,
        seconds=elapsed,
        requests=summary["requests"],
        throughput=max(0, summary["requests"] - errors["status"]) / elapsed,
        p50_ms=latency["p50"] / 1e3,
        p90_ms=latency["p90"] / 1e3,
        p99_ms=latency["p99"] / 1e3,
        max_ms=latency["max"] / 1e3,
        mean_ms=latency["mean"] / 1e3,
        errors=failed,
        error_detail=errors,
    )
