"""A worker's resident memory after a burst of large uploads: right after it, and once the worker is idle.

    python -m bench.idle_memory             # about a minute; prints one line per moment

Starts ``python -m service`` on the committed repository (loopback, a free port), posts
``--rounds`` rounds of ``--clients`` concurrent chunked uploads of one 5600x5600 noise JPEG
(about 19 MB, under the 20 MiB body cap: chunked, so each body is counted as it arrives and most are refused 503 for the
body budget) to ``vit-cifar10``'s classify, and reads the worker's ``VmRSS`` (``/proc``) at start,
after each round and ``--idle`` seconds after the last. The server gives freed memory back once
it has held no request for 1 s (``service/core/memory.py``); without that, glibc's arenas kept
most of the burst's peak (docs/operation.md). Memory, not time: the figures do not depend on how
busy the machine is, only on what the server was sent.
"""

from __future__ import annotations

import argparse
import http.client
import io
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from bench.servers import HOST, patchserve, start

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def noise_jpeg(side: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=75)
    return out.getvalue()


def upload(port: int, path: str, body: bytes, outcomes: Counter) -> None:
    """One chunked POST of ``body`` (64 KiB chunks); its status, or the exception's name, counted."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
        connection.request("POST", path, body=chunks, headers={"Content-Type": "image/jpeg"}, encode_chunked=True)
        response = connection.getresponse()
        response.read()
        outcomes[response.status] += 1
    except Exception as exc:  # a reset is a finding, not a crash of the benchmark
        outcomes[type(exc).__name__] += 1
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=40, help="concurrent uploads in a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", type=int, default=5600, help="the JPEG's width and height, pixels")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds after the last round to read again")
    args = parser.parse_args(argv)
    body = noise_jpeg(args.side)
    server = patchserve(ROOT / "model_repository", "vit-cifar10")
    running = start(server, ROOT / "bench" / ".work" / "idle_memory")
    try:
        pid = running.process.pid  # python -m service with one worker: the worker is this process
        print(f"{len(body):,}-byte JPEG, {args.clients} clients x {args.rounds} rounds")
        print(f"start: {rss_mib(pid):.0f} MiB")
        for round_ in range(1, args.rounds + 1):
            outcomes: Counter = Counter()
            threads = [
                threading.Thread(target=upload, args=(running.port, server.path, body, outcomes))
                for _ in range(args.clients)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print(f"after round {round_}: {rss_mib(pid):.0f} MiB  {dict(sorted(outcomes.items(), key=str))}")
        time.sleep(args.idle)
        print(f"{args.idle:g} s idle: {rss_mib(pid):.0f} MiB")
    finally:
        running.stop()


if __name__ == "__main__":
    main()
