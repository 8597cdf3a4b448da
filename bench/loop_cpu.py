"""The event loop's CPU per request of the ASGI app alone, in process: no sockets, no load generator.

    .venv/bin/python -m bench.loop_cpu --model vit-cifar10                 # patchserve's app
    .venv/bin/python -m bench.loop_cpu --model vit-cifar10 --naive         # bench/naive_app.py's
    .venv/bin/python -m bench.loop_cpu --model vit-cifar10 --profile       # and cProfile's top functions
    .venv/bin/python -m bench.loop_cpu --model vit-cifar10 --router        # without the direct path

Builds the app (``service.http.app.create_app`` on ``--repository``, auto-tuner off, or the naive
endpoint on the model's highest version), waits until it is ready, then calls it directly with
one multipart POST at a time (``--image``; by default the benchmark's 640x480 ``chelsea.jpg``,
written by :func:`bench.images.prepare` when missing), ``--requests`` per round, and prints per
round the thread CPU time of the event loop's thread (``time.thread_time``: what uvicorn's loop
would spend in the app, without HTTP parsing and socket I/O), the process's CPU time (every
thread: decoding and ONNX Runtime too) and the wall time, each per request.

What it is for: comparing two versions of the serving path's Python on the same machine (run it on
each, alternately): thread CPU time counts only this thread's running, so another process on the
machine disturbs it less than a throughput figure, though not at all is too much to claim. It is
not ``make bench``: it measures no server, no concurrency and no latency.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import mimetypes
import os
import pstats
import time
from pathlib import Path
from typing import Any

BOUNDARY = b"patchserve-loop-cpu"


def multipart(image: bytes, filename: str) -> bytes:
    """One ``image`` part, as curl -F image=@file sends it."""
    media = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    return (
        b"--" + BOUNDARY + b"\r\n"
        b'Content-Disposition: form-data; name="image"; filename="' + filename.encode() + b'"\r\n'
        b"Content-Type: " + media.encode() + b"\r\n\r\n" + image + b"\r\n--" + BOUNDARY + b"--\r\n"
    )


async def post(app: Any, path: str, body: bytes) -> int:
    """One POST of ``body`` to ``path`` through ``app``; its status."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"multipart/form-data; boundary=" + BOUNDARY),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the app runs
        raise AssertionError("unreachable")

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


async def measure(args: argparse.Namespace) -> None:
    image = args.image
    if image is None:
        from bench import images

        [image] = [p for p in images.prepare(args.work / "images")["640x480"] if p.name == "chelsea.jpg"]
    body = multipart(image.read_bytes(), image.name)
    if args.naive:
        versions = [p for p in (args.repository / args.model).iterdir() if p.name.isdigit()]
        os.environ["PATCHSERVE_BENCH_MODEL"] = str(max(versions, key=lambda p: int(p.name)))
        app, path = importlib.import_module("bench.naive_app").app, "/predict"
        lifespan: Any = None
    else:
        from service.core.settings import Settings
        from service.http.app import create_app

        app = create_app(Settings(model_repository=args.repository, device="cpu", auto_tune=False))
        if args.router:  # every request through FastAPI's router, as before service/http/direct.py
            from service.http.direct import DirectInference

            app.user_middleware = [m for m in app.user_middleware if m.cls is not DirectInference]
        path, lifespan = f"/v1/models/{args.model}/classify", app.router.lifespan_context(app)
    if lifespan is not None:
        await lifespan.__aenter__()
    try:
        for _ in range(3000):  # until the models are loaded (a bound, not a measured figure)
            if await post(app, path, body) == 200:
                break
            await asyncio.sleep(0.01)
        else:
            raise SystemExit(f"{path} never answered 200")
        for _ in range(args.warm_up):
            await post(app, path, body)
        profile = cProfile.Profile() if args.profile else None
        for r in range(args.rounds):
            loop0, process0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
            if profile is not None:
                profile.enable()
            for _ in range(args.requests):
                await post(app, path, body)
            if profile is not None:
                profile.disable()
            n = args.requests
            print(
                f"round {r + 1}: event loop {1e3 * (time.thread_time() - loop0) / n:.3f} ms CPU per request, "
                f"process {1e3 * (time.process_time() - process0) / n:.3f} ms CPU, "
                f"wall {1e3 * (time.perf_counter() - wall0) / n:.3f} ms"
            )
        if profile is not None:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    finally:
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loop_cpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--model", default="vit-cifar10", help="a classifier in the repository")
    parser.add_argument("--image", type=Path, default=None, help="a JPEG (default: the 640x480 chelsea.jpg)")
    parser.add_argument("--work", type=Path, default=Path("bench/.work"))
    parser.add_argument("--requests", type=int, default=1000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=200, help="requests before the first round")
    parser.add_argument("--naive", action="store_true", help="bench/naive_app.py on the model's highest version")
    parser.add_argument(
        "--router", action="store_true", help="patchserve without its direct path: every request through the router"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the rounds (slows them: CPU figures inflate)")
    args = parser.parse_args(argv)
    import uvloop  # as uvicorn runs patchserve

    uvloop.run(measure(args))


if __name__ == "__main__":
    main()
