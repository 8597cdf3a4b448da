"""A load generator in Python (asyncio, standard library only), for machines without wrk.

The GPU machine has no apt and no wrk (docs/gpu.md), so ``bench.gpu --loadgen python`` uses
this instead. It keeps the protocol of ``bench/loadgen.py``: a closed loop, exactly
``concurrency`` requests in flight, one per keep-alive connection, multipart bodies built
once (the same as ``bench/multipart.lua``), each connection starting at a different file,
every latency recorded. It is not wrk: Python spends tens of microseconds of CPU per request
where wrk spends a few, so the connections are spread over up to ``processes`` processes
(each its own event loop), and the CPU time they used is reported (``client_cpu_s``) so a
reader can tell whether the client, not the server, set the pace. On the 2-core development
machine use wrk (``bench.loadgen``), whose cost is next to nothing.

HTTP/1.1 only as far as patchserve answers it: ``Content-Length`` bodies, keep-alive; a
connection the server closes is reopened and counted as a read error.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from bench.loadgen import LoadResult

BOUNDARY = "----patchserve-bench-7c1e0f5a"  # bench/multipart.lua's


def request_bytes(host: str, port: int, path: str, field: str, file: Path) -> bytes:
    """One complete HTTP/1.1 POST of ``file`` as a multipart/form-data part named ``field``."""
    body = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{field}"; filename="{file.name}"\r\n'
            "Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + file.read_bytes()
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; return (status, whether the connection stays open)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" not in headers:
        raise ConnectionError(f"a response without Content-Length ({headers.get('transfer-encoding')})")
    await reader.readexactly(int(headers["content-length"]))
    return status, headers.get("connection", "").lower() != "close"


async def _connection(
    address: tuple[str, int], requests: Sequence[bytes], start: int, until: float, timeout: float, out: dict
) -> None:
    """One closed-loop connection until ``until`` (perf_counter): send, wait for the answer, send the next."""
    index, conn = start, None
    while time.perf_counter() < until:
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
            reader, writer = conn
            began = time.perf_counter()
            writer.write(requests[index % len(requests)])
            index += 1
            status, keep = await asyncio.wait_for(_response(reader), timeout)
            out["latency"].append(time.perf_counter() - began)
            out["requests"] += 1
            out["status"] += not 200 <= status < 400
            if not keep:
                writer.close()
                conn = None
        except TimeoutError:
            out["timeout"] += 1
            conn = _close(conn)
        except (OSError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            out["connect" if conn is None else "read"] += 1
            conn = _close(conn)
            await asyncio.sleep(0.01)
    _close(conn)


def _close(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
    if conn is not None:
        conn[1].close()


def _worker(url: str, files: Sequence[Path], field: str, connections: Sequence[int], seconds: float, timeout: float):
    """One process: ``connections`` (their indices) for ``seconds``; returns its counts and latencies."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    requests = [request_bytes(*address, path, field, f) for f in files]
    out = {"latency": [], "requests": 0, "status": 0, "connect": 0, "read": 0, "write": 0, "timeout": 0}

    async def run() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_connection(address, requests, i, until, timeout, out) for i in connections))

    cpu = time.process_time()
    asyncio.run(run())
    out["cpu_s"] = time.process_time() - cpu
    return out


def run(
    url: str,
    files: Sequence[Path],
    *,
    concurrency: int,
    seconds: float,
    field: str = "image",
    timeout: float = 60.0,
    processes: int | None = None,
) -> LoadResult:
    """Post ``files`` (cycled) to ``url`` from ``concurrency`` connections for ``seconds``, as ``loadgen.run`` does.

    Args:
        processes: processes the connections are spread over (default: up to 4, a quarter of
            the cores, never more than the connections).

    Returns:
        The same figures as wrk's run, and ``error_detail["client_cpu_ms_per_request"]``: the
        load generator's own CPU time per response, in milliseconds.
    """
    processes = processes or max(1, min(concurrency, 4, (os.cpu_count() or 1) // 4))
    shares = [list(range(p, concurrency, processes)) for p in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        outs = pool.starmap(_worker, [(url, list(files), field, share, seconds, timeout) for share in shares])
    latency_ms = 1e3 * np.array([v for out in outs for v in out["latency"]] or [0.0])  # (requests,)
    requests = sum(out["requests"] for out in outs)
    errors = {key: sum(out[key] for out in outs) for key in ("connect", "read", "write", "status", "timeout")}
    p50, p90, p99 = np.percentile(latency_ms, [50, 90, 99])
    detail = errors | {"client_cpu_ms_per_request": round(1e3 * sum(o["cpu_s"] for o in outs) / max(requests, 1), 3)}
    return LoadResult(
        concurrency=concurrency,
        seconds=seconds,
        requests=requests,
        throughput=max(0, requests - errors["status"]) / max(seconds, 1e-9),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        max_ms=float(latency_ms.max()),
        mean_ms=float(latency_ms.mean()),
        errors=sum(errors.values()),
        error_detail=detail,
    )
