"""What a refused /v2 body costs after its answer: nothing kept alive, nothing run for a client that left."""

from __future__ import annotations

import asyncio
import gc
import gzip
import threading

import orjson
import pytest

from tests.conftest import ROOT, running_app
from tests.service.helpers import BIG, INFER, asgi_post, big_buffers_in_cycles, digit_tensor, json_request

pytestmark = pytest.mark.anyio

DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


async def test_refused_bodies_are_not_kept_alive_by_reference_cycles() -> None:
    # Found by a fresh user: each refused /v2 body (a gzip bomb's 413, 20 MB of JSON that is not)
    # stayed in memory after its answer, in reference cycles through its error's traceback (orjson's
    # error keeps the whole document as a str; a future keeps the error that keeps the frame that
    # keeps the future); under load they reached the collector's oldest generation: 400 such
    # requests took a worker to 5 GiB, and gc.collect() gave 4.8 of it back.
    spaces = b"{" + b" " * (4 * BIG)  # not JSON: 400, parsed in a decode thread
    bodies = [
        (gzip.compress(b"\0" * (21 * BIG)), {"Content-Encoding": "gzip"}, 413),  # inflates past the 20 MiB cap
        (gzip.compress(spaces), {"Content-Encoding": "gzip"}, 400),
        (spaces, {}, 400),
        (b"[" * 100 + b"]" * 100 + b" " * (2 * BIG), {}, 400),  # refused before parsing (its nesting)
    ]
    gc.collect()
    gc.disable()  # only the full collection below looks for cycles
    try:
        async with running_app() as client:  # (posted as raw ASGI: an HTTP client's own objects hold bodies)
            for body, headers, status in bodies:
                assert await post(client.app, body, headers) == status
            ok = gzip.compress(orjson.dumps(json_request(digit_tensor(DIGIT_7))))
            assert await post(client.app, ok, {"Content-Encoding": "gzip"}) == 200
            assert big_buffers_in_cycles() == []
    finally:
        gc.enable()


async def post(app, body: bytes, headers: dict[str, str], leave: bool = False) -> int | None:
    """POST ``body`` to /v2 infer as raw ASGI; the response's status (None if none was sent).

    ``leave``: the client goes away once its body is sent.
    """
    scope = asgi_post(INFER, body, [(k.lower().encode(), v.encode()) for k, v in headers.items()])
    scope["headers"] = [h for h in scope["headers"] if h[0] != b"content-type"]
    messages = [{"type": "http.disconnect"}] if leave else []
    messages.append({"type": "http.request", "body": body, "more_body": False})
    statuses: list[int] = []

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)  # the client stays: no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0] if statuses else None


@pytest.mark.parametrize("step", ["inflate", "parse_infer_request"])
async def test_a_large_body_is_inflated_and_parsed_off_the_event_loop(monkeypatch, step: str) -> None:
    # Found by a fresh user: 40 gzip bodies of 20 KB, each 20 MB of JSON once inflated (0.25 s of
    # parsing to refuse), held /v2/health/live up for 9 s: parsing ran on the event loop (and, until
    # a reread, inflating: a 20 MB body of 64 gzip members took 0.2 s). Here the step waits until a
    # probe is answered.
    from service.http.routes import v2 as routes

    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    done = getattr(routes, step)

    def slowly(*args):
        started.set()
        release.wait(10)  # on the event loop, the probe below could not be answered meanwhile
        finished.set()
        return done(*args)

    monkeypatch.setattr(routes, step, slowly)
    body = orjson.dumps(json_request(digit_tensor(DIGIT_7))) + b" " * routes.PARSE_ON_LOOP_BYTES
    headers = {"Content-Encoding": "gzip"} if step == "inflate" else {}
    async with running_app() as client:
        posted = asyncio.ensure_future(post(client.app, gzip.compress(body) if headers else body, headers))
        assert await asyncio.to_thread(started.wait, 10)
        live = await client.get("/v2/health/live")
        answered_meanwhile = not finished.is_set()
        release.set()
        assert await posted == 200
    assert live.status_code == 200 and answered_meanwhile


async def test_a_body_whose_client_left_is_never_parsed(monkeypatch) -> None:
    # Found by a fresh user: 100 clients that sent a 20 KB gzip body (19 MB of JSON inflated) and
    # hung up cost the worker 8.9 s of CPU after they had gone (and /healthz waited 8.7 s): only the
    # model run watched for a disconnect. Here the decode threads are busy while the client leaves.
    from service.http.routes import v2 as routes

    parsed: list[bool] = []
    parse = routes.parse_infer_request
    monkeypatch.setattr(routes, "parse_infer_request", lambda *args: parsed.append(True) or parse(*args))
    body = orjson.dumps(json_request(digit_tensor(DIGIT_7))) + b" " * routes.PARSE_ON_LOOP_BYTES
    async with running_app() as client:
        pool = client.app.state.server.decode_pool
        release = threading.Event()
        busy = [pool.submit(release.wait, 10) for _ in range(pool.threads)]
        try:
            assert await post(client.app, gzip.compress(body), {"Content-Encoding": "gzip"}, leave=True) != 200
            assert await post(client.app, body, {}, leave=True) != 200
        finally:
            release.set()
        assert all(await asyncio.to_thread(lambda: [b.result(10) for b in busy]))
        assert await post(client.app, body, {}) == 200  # queued behind any job left in the pool
    assert parsed == [True]  # only the last one's
