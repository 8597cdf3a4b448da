"""Admission in process: the in-flight cap (503 before the body is read), the body timeout (408)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import ROOT, running_app
from tests.service.helpers import HeldRequest, asgi_post, sample, until

pytestmark = pytest.mark.anyio


DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


CLASSIFY = "/v1/models/vit-digits/classify"


def delta(before: str, after: str, **labels: str) -> float:
    """How much ``patchserve_requests_total{labels}`` grew between two scrapes."""
    return sample(after, "patchserve_requests_total", **labels) - sample(before, "patchserve_requests_total", **labels)


async def test_requests_over_the_cap_get_503_with_retry_after_once_their_body_is_dropped() -> None:
    async with running_app(max_in_flight=2) as client:
        app = client.app
        held = [HeldRequest(app), HeldRequest(app)]
        await until(lambda: all(h.body_reads == 1 for h in held))  # both inside, waiting for their bodies
        before = (await client.get("/metrics")).text
        third = HeldRequest(app)
        await until(lambda: third.body_reads == 1)  # refused: its body is read to be dropped...
        assert not third.task.done()  # ...before the 503, so that a client writing it all first reads the 503
        third.release()
        await until(lambda: third.task.done())
        assert third.body_reads == 1 and "connection" not in third.headers  # all read: the connection may live on
        assert third.status == 503 and third.headers["retry-after"] == "1"
        assert third.headers["content-type"] == "application/problem+json"
        problem = third.body
        assert problem["status"] == 503 and "PATCHSERVE_MAX_IN_FLIGHT" in problem["detail"]
        assert problem["instance"] == third.headers["x-request-id"]
        # probes and metrics are never refused, even with the worker full
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        after = (await client.get("/metrics")).text
        assert delta(before, after, model="vit-digits", version="1", outcome="rejected") == 1
        for h in held:
            h.release()
        await asyncio.wait_for(asyncio.gather(*(h.task for h in held)), 10)
        assert [h.status for h in held] == [200, 200]
        assert all(h.body["predictions"][0]["label"] == "7" for h in held)
        # the slots are free again
        response = await client.post(CLASSIFY, files={"image": DIGIT_7})
        assert response.status_code == 200


async def test_a_refused_request_for_an_unknown_model_is_counted_as_unknown(monkeypatch) -> None:
    from service.http.middleware import admission

    monkeypatch.setattr(admission, "DRAIN_SECONDS", 0.05)  # its body never comes: the drain gives up
    async with running_app(max_in_flight=1) as client:
        held = HeldRequest(client.app)
        await until(lambda: held.body_reads == 1)
        before = (await client.get("/metrics")).text
        refused = HeldRequest(client.app, "/v1/models/no-such-model/classify")
        await until(lambda: refused.task.done())
        after = (await client.get("/metrics")).text
        held.release()
        await held.task
    assert refused.status == 503
    labels = {"model": "_unknown", "outcome": "rejected"}
    assert delta(before, after, **labels) == 1
    assert "no-such-model" not in after


async def test_a_body_not_received_in_time_is_408_and_closes_the_connection() -> None:
    async with running_app(body_timeout=0.2) as client:
        before = (await client.get("/metrics")).text
        stalled = HeldRequest(client.app)  # never released: the body never comes
        await asyncio.wait_for(stalled.task, 5)
        after = (await client.get("/metrics")).text
        on_time = await client.post(CLASSIFY, files={"image": DIGIT_7})
    assert stalled.status == 408
    assert stalled.headers["connection"] == "close"
    assert stalled.headers["content-type"] == "application/problem+json"
    assert "0.2 s" in stalled.body["detail"] and "PATCHSERVE_BODY_TIMEOUT" in stalled.body["detail"]
    labels = {"model": "vit-digits", "version": "1", "outcome": "client_error"}
    assert delta(before, after, **labels) == 1
    assert on_time.status_code == 200


async def test_exempt_paths_are_served_while_the_worker_is_full() -> None:
    # The slot is held until the test releases it (no race with a body timeout on a busy machine).
    async with running_app(max_in_flight=1, body_timeout=60.0) as client:
        held = HeldRequest(client.app)
        await until(lambda: held.body_reads >= 1)
        refused = await client.post(CLASSIFY, files={"image": DIGIT_7})
        probes = ("/healthz", "/readyz", "/metrics", "/v2/health/ready", "/v2/models/vit-digits/ready")
        responses = await asyncio.gather(*(client.get(p) for p in (*probes, "/v2/models/vit-digits/versions/1/ready")))
        # a model's readiness is a probe (KServe's, tritonclient's is_model_ready); its metadata is not
        metadata = await client.get("/v2/models/vit-digits")
        still_held = not held.task.done()
        held.release()
        await asyncio.wait_for(held.task, 10)
    assert still_held and refused.status_code == 503
    assert [r.status_code for r in responses] == [200] * 6
    assert metadata.status_code == 503 and "PATCHSERVE_MAX_IN_FLIGHT" in metadata.json()["error"]
    assert held.status == 200


async def test_probes_by_any_method_and_a_get_or_head_of_a_whole_readiness_path_are_exempt() -> None:
    from service.http.app import admission_exempt
    from service.http.middleware.admission import AdmissionMiddleware

    async def app(scope, receive, send) -> None:  # never reached by the refused
        raise AssertionError(scope["path"])

    middleware = AdmissionMiddleware(app, max_in_flight=0, body_timeout=1.0, exempt=admission_exempt)
    for method, path, exempt in [
        ("GET", "/v2/models/vit-digits/ready", True),
        ("HEAD", "/v2/models/vit-digits/versions/1/ready", True),
        ("POST", "/v2/models/vit-digits/ready", False),
        ("GET", "/v2/models/vit-digits/ready/x", False),
        ("GET", "/v2/models/a/b/ready", False),
        ("GET", "/v1/models/vit-digits/ready", False),
        ("POST", "/metrics", True),  # the fixed paths, by any method
        ("DELETE", "/v2/health/ready", True),
        ("GET", "/healthz/x", False),
    ]:
        assert middleware.exempt({"type": "http", "method": method, "path": path}) is exempt, (method, path)


async def test_a_body_that_arrived_is_taken_even_when_the_app_reads_it_after_the_deadline() -> None:
    # Found by CI on a busy machine: past the deadline, wait_for(receive(), 0) on Python 3.11
    # cancelled the read before it ran, so a request whose body had long arrived got a 408.
    from service.http.middleware.admission import AdmissionMiddleware

    read: list[bytes] = []

    async def slow_app(scope, receive, send) -> None:
        await asyncio.sleep(0.1)  # the app reaches its body after the 0.01 s deadline
        read.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict:
        return {"type": "http.request", "body": DIGIT_7, "more_body": False}  # already here

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = AdmissionMiddleware(slow_app, max_in_flight=1, body_timeout=0.01)
    await middleware(asgi_post(CLASSIFY, DIGIT_7), receive, send)
    assert read == [DIGIT_7] and sent[0]["status"] == 200


async def test_a_refused_body_that_does_not_come_or_waits_for_100_continue_gets_the_503_and_a_close(
    monkeypatch,
) -> None:
    from service.http.middleware import admission

    monkeypatch.setattr(admission, "DRAIN_SECONDS", 0.05)
    async with running_app(max_in_flight=1) as client:
        app = client.app
        holder = HeldRequest(app)
        await until(lambda: holder.body_reads == 1)
        stalled = HeldRequest(app)  # its body never comes: the drain gives up after DRAIN_SECONDS
        await until(lambda: stalled.task.done())
        assert stalled.status == 503 and stalled.headers["connection"] == "close"
        waiting = HeldRequest(app, headers=[(b"expect", b"100-continue")])  # sends nothing until told to
        await until(lambda: waiting.task.done())
        assert waiting.body_reads == 0 and waiting.status == 503 and waiting.headers["connection"] == "close"
        holder.release()
        await asyncio.wait_for(holder.task, 10)
        assert holder.status == 200


@pytest.mark.parametrize("path", [CLASSIFY, "/v2/models/vit-digits/infer"])
async def test_a_body_still_arriving_at_the_request_deadline_is_a_504_at_the_deadline(path: str, monkeypatch) -> None:
    # Found by fresh users: a 40 s trickle upload was told "...while this image was being decoded";
    # then one whose body never came got the 408 of the 60 s body timeout, not its own 0.05 s deadline.
    from service.http import lifetime

    monkeypatch.setattr(lifetime, "DRAIN_SECONDS", 0.05)  # its body never comes: the drain gives up
    async with running_app() as client:
        late = HeldRequest(client.app, path, headers=[(b"x-request-timeout", b"0.05")])  # never released
        await asyncio.wait_for(late.task, 30)  # the 60 s body timeout would fail this wait
    assert late.status == 504 and late.headers["connection"] == "close"
    detail = late.body["detail"] if path == CLASSIFY else late.body["error"]
    assert "deadline passed while its body was still arriving" in detail


@pytest.mark.parametrize("path", [CLASSIFY, "/v2/models/vit-digits/infer"])
async def test_the_504_of_a_late_body_is_sent_once_the_rest_of_the_body_is_read(path: str) -> None:
    # Found by a fresh user under load (128 clients, X-Request-Timeout 1-50 ms): the 504 went out and
    # the connection was closed with the body unread, so the kernel answered with a TCP reset and
    # clients that write their whole body before reading (httpx, raw sockets) never saw the 504.
    rest, reads, sent = asyncio.Event(), [], []

    async def receive() -> dict:
        reads.append(len(reads))
        if len(reads) == 1:
            return {"type": "http.request", "body": DIGIT_7[:100], "more_body": True}
        if len(reads) == 2:
            await rest.wait()
            return {"type": "http.request", "body": DIGIT_7[100:], "more_body": False}
        await asyncio.Event().wait()  # after the body: a disconnect that never comes
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    async with running_app() as client:
        scope = asgi_post(path, DIGIT_7, [(b"x-request-timeout", b"0.05")])
        task = asyncio.create_task(client.app(scope, receive, send))
        await asyncio.sleep(0.5)  # well past the deadline: the rest of the body is awaited (up to 5 s) first
        assert sent == [] and len(reads) >= 2
        rest.set()
        await asyncio.wait_for(task, 10)
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 504
    assert (b"connection", b"close") in start["headers"]


async def test_a_chunk_arriving_with_the_request_deadline_does_not_lose_the_deadline() -> None:
    # Found in review: on Python 3.11, asyncio.wait_for returns a read that completed in the loop
    # iteration in which an outer cancellation arrived and swallows the cancellation, so the
    # request deadline of body_by_deadline was lost and the read went on to the body timeout.
    from service.core.errors import DeadlineExceeded
    from service.http.lifetime import body_by_deadline
    from service.http.middleware.admission import AdmissionMiddleware

    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[dict] = asyncio.Queue()
    receive = AdmissionMiddleware(None, max_in_flight=1, body_timeout=60.0)._with_deadline(chunks.get)

    async def read_body() -> bytes:
        parts = []
        while True:
            message = await receive()
            parts.append(message["body"])
            if not message["more_body"]:
                return b"".join(parts)

    def chunk_then_busy() -> None:  # a chunk arrives just before the deadline, then the loop is busy
        chunks.put_nowait({"type": "http.request", "body": b"x", "more_body": True})
        time.sleep(0.02)

    loop.call_later(0.095, chunk_then_busy)
    rest = loop.call_later(5.0, lambda: chunks.put_nowait({"type": "http.request", "body": b"y", "more_body": False}))
    with pytest.raises(DeadlineExceeded, match="still arriving"):
        await body_by_deadline(read_body(), 0.1)
    rest.cancel()


async def test_a_body_past_the_workers_byte_budget_waits_unread_for_room() -> None:
    # Found by a fresh user: 200 clients posting 17 MB of photos each took a worker from 170 MiB to
    # 2.4 GiB (128 in flight x their bodies). The bodies a worker holds are bounded now, and a
    # request past the bound waits with its body unread (TCP holds the client back) rather than
    # being refused: refusing drained 17 MB a time and left the server reading instead of serving.
    async with running_app(max_buffered_bytes=4 * len(DIGIT_7) + 100, max_in_flight=64) as client:
        app = client.app
        held = [HeldRequest(app) for _ in range(4)]  # four bodies of 235 bytes fit in 1,040
        await until(lambda: all(h.body_reads == 1 for h in held))
        fifth = HeldRequest(app)
        fifth.release()  # its body is there to be read...
        await asyncio.sleep(0.1)
        assert fifth.body_reads == 0 and not fifth.task.done()  # ...but it waits, unread
        assert (await client.get("/v1/models")).status_code == 200  # a request without a body never waits
        held[0].release()
        await until(lambda: fifth.task.done())
        assert fifth.status == 200  # in once the first gave its bytes back
        for h in held[1:]:
            h.release()
        await asyncio.wait_for(asyncio.gather(*(h.task for h in held)), 10)
        assert [h.status for h in held] == [200] * 4
        # a body larger than the whole budget is taken when the worker holds no other
        chelsea = (ROOT / "examples" / "chelsea.png").read_bytes()  # 240 KB against 1,040 bytes
        photo = await client.post("/v1/models/vit-cifar10/classify", files={"image": chelsea})
        assert photo.status_code == 200, photo.text


async def test_a_body_that_waits_past_its_body_timeout_for_room_gets_the_503() -> None:
    from service.http.middleware.admission import AdmissionMiddleware

    async def app(scope, receive, send) -> None:
        raise AssertionError("never admitted")

    middleware = AdmissionMiddleware(app, max_in_flight=8, body_timeout=0.05, max_buffered_bytes=1024)
    middleware.buffered = 1000  # another request holds 1,000 bytes, and keeps them
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": DIGIT_7, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await middleware(asgi_post(CLASSIFY, DIGIT_7), receive, send)
    assert sent[0]["status"] == 503 and b"PATCHSERVE_MAX_BUFFERED_BYTES" in sent[1]["body"]
    assert middleware.buffered == 1000 and middleware.in_flight == 0 and not middleware._waiting


async def test_a_chunked_body_is_counted_as_it_arrives_and_refused_once_past_the_budget() -> None:
    from service.core.errors import ProblemError
    from service.http.middleware.admission import AdmissionMiddleware

    reached: list[bytes] = []
    refusals: list[ProblemError] = []

    async def app(scope, receive, send) -> None:  # a route reading its body; its errors answered as the app's are
        try:
            while True:
                message = await receive()
                reached.append(message["body"])
                if not message.get("more_body"):
                    break
        except ProblemError as error:
            refusals.append(error)
            headers = [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
            await send({"type": "http.response.start", "status": error.status, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    # The rest of the body is read and dropped before the 503 (a fresh user's http.client uploads,
    # which write the whole body before reading, got TCP resets), unless it is over the drain bound;
    # its bytes go back before that drain (held through it, 40 concurrent uploads were all refused).
    for chunk_count, closes in ((6, False), (9, True)):
        reached.clear()
        refusals.clear()
        scope = asgi_post(CLASSIFY, b"")
        scope["headers"] = [h for h in scope["headers"] if h[0] != b"content-length"]  # chunked: none declared
        middleware = AdmissionMiddleware(
            app, max_in_flight=8, body_timeout=60.0, max_buffered_bytes=3000, drain_bytes=5000
        )
        middleware.buffered = 1000  # another request holds 1,000 bytes
        chunks = [{"type": "http.request", "body": b"\0" * 1000, "more_body": True}] * (chunk_count - 1)
        chunks.append({"type": "http.request", "body": b"\0" * 1000, "more_body": False})
        started: list[tuple[dict, int, int]] = []  # the answer, the budget held and the chunks left as it went

        async def receive(chunks: list[dict] = chunks) -> dict:
            return chunks.pop(0)

        async def send(message: dict, chunks=chunks, started=started, middleware=middleware) -> None:
            if message["type"] == "http.response.start":
                started.append((message, middleware.buffered, len(chunks)))

        await middleware(scope, receive, send)
        ((answer, buffered_then, left_then),) = started
        assert answer["status"] == 503 and len(reached) == 2
        assert "with its 3,000 bytes, this worker would hold 4,000 bytes" in refusals[0].detail  # (not "holds")
        assert ((b"connection", b"close") in answer["headers"]) == closes
        assert buffered_then == 1000 and middleware.buffered == 1000  # its 3,000 bytes given back before the drain
        # 3 chunks counted, then drained: the other 3, or 6 (past the 5,000-byte bound) of 6
        assert left_then == len(chunks) == chunk_count - 3 - (6 if closes else 3)


async def test_the_bytes_a_413_reads_and_drops_are_not_counted_in_the_budget() -> None:
    from starlette.requests import Request

    from service.http.middleware.admission import AdmissionMiddleware
    from service.http.uploads import _too_large

    answers: list[object] = []

    async def app(scope, receive, send) -> None:  # a route that reads a chunk, finds the body over its cap
        request = Request(scope, receive)
        first = await receive()
        assert first["more_body"]
        answers.append(await _too_large(request, "over the cap", max_bytes=1000))
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = AdmissionMiddleware(app, max_in_flight=8, body_timeout=60.0, max_buffered_bytes=3000)
    middleware.buffered = 1000  # another request holds 1,000 bytes
    chunks = [{"type": "http.request", "body": b"\0" * 1000, "more_body": True}] * 3
    chunks.append({"type": "http.request", "body": b"\0" * 500, "more_body": False})  # 3,500: within 4x the cap

    async def receive() -> dict:
        return chunks.pop(0)

    scope = asgi_post(CLASSIFY, b"")
    scope["headers"] = [h for h in scope["headers"] if h[0] != b"content-length"]  # chunked: nothing declared
    await middleware(scope, receive, lambda message: asyncio.sleep(0))
    (too_large,) = answers
    assert getattr(too_large, "status", None) == 413
    assert "Connection" not in too_large.headers  # the whole body was read: the client gets the 413, no reset
    assert chunks == [] and middleware.buffered == 1000  # its first 1,000 bytes given back; 2,500 never counted


async def test_a_request_cancelled_at_the_graceful_shutdown_timeout_is_answered_503_and_counted() -> None:
    # Found by an ops tester: at PATCHSERVE_GRACEFUL_SHUTDOWN_TIMEOUT uvicorn cancels what still runs;
    # each such request logged an ERROR traceback, its client read a broken pipe, and no metric counted it.
    from service.core import lifecycle

    async with running_app() as client:
        before = (await client.get("/metrics")).text
        stuck = HeldRequest(client.app)  # its body never comes
        await until(lambda: stuck.body_reads == 1)
        lifecycle.request_shutdown()
        try:
            stuck.task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")  # as uvicorn does
            await asyncio.wait([stuck.task], timeout=10)
        finally:
            lifecycle.clear_shutdown()
        after = (await client.get("/metrics")).text
    assert not stuck.task.cancelled() and stuck.task.exception() is None  # answered, not torn down
    assert stuck.status == 503 and stuck.headers["connection"] == "close"
    assert "shut down before this request was done" in stuck.body["detail"]
    assert delta(before, after, model="vit-digits", version="1", outcome="cancelled") == 1


async def test_the_body_budget_queue_never_stalls_behind_what_cannot_fit() -> None:
    # Found by a reviewer: a header-only POST declaring 10**12 bytes waited at the head of the queue
    # and every upload behind it waited the body timeout; and a waiter that gave up woke nobody.
    from service.core import lifecycle
    from service.core.errors import Unavailable
    from service.http.lifetime import drain_body
    from service.http.middleware.admission import AdmissionMiddleware

    admitted: list[int] = []

    async def app(scope, receive, send) -> None:
        admitted.append(len(admitted))
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: dict) -> None:
        pass

    async def nothing() -> dict:
        await asyncio.Event().wait()  # a client that sends its headers only
        return {}

    middleware = AdmissionMiddleware(app, max_in_flight=8, body_timeout=60.0, drain_bytes=5000, max_buffered_bytes=100)
    middleware.buffered = 60  # another request holds 60 of the 100 bytes
    huge = asgi_post(CLASSIFY, b"")
    huge["headers"] = [
        (b"content-length", b"1000000000000") if k == b"content-length" else (k, v) for k, v in huge["headers"]
    ]
    await asyncio.wait_for(middleware(huge, nothing, send), 5)  # over the body cap: holds nothing, its route refuses it
    assert admitted == [0] and middleware.buffered == 60 and not middleware._waiting

    now = time.monotonic()
    behind = await asyncio.gather(middleware._reserve(50, now + 0.05), middleware._reserve(10, now + 30))
    assert behind == [False, True] and middleware.buffered == 70  # the second was woken when the first gave up
    middleware._give_back(10)

    waiting = asyncio.create_task(middleware._reserve(50, time.monotonic() + 30))
    await until(lambda: middleware._waiting)
    lifecycle.request_shutdown()  # every wait ends at a shutdown: no waiter holds up the drain
    try:
        assert await asyncio.wait_for(waiting, 5) is False
    finally:
        lifecycle.clear_shutdown()
    assert middleware.buffered == 60 and not middleware._waiting

    async def refused() -> dict:
        raise Unavailable("no room")

    assert await drain_body(refused, {}, 10_000, 5.0) is False  # a 413's drain stops there: the 413 stands


async def test_the_budget_holds_only_bodies_routes_read_and_a_stopping_server_answers_waiters_at_once() -> None:
    # A second look by the reviewer: a keyless POST / declaring 1 MiB waited in the queue holding a
    # slot; a header-only waiter refused at a shutdown then waited 30 s for its body, holding up the drain.
    from service.core import lifecycle
    from service.http.middleware.admission import AdmissionMiddleware, _declared_length

    one_mib = [(b"content-length", b"1048576")]
    assert _declared_length({"path": "/", "method": "POST", "headers": one_mib}) == 0
    assert _declared_length({"path": "/v1/models/vit-digits/classify", "method": "POST", "headers": one_mib}) == 1 << 20
    assert _declared_length({"path": "/v2/models/vit-digits/infer", "method": "GET", "headers": one_mib}) == 0

    reads: list[int] = []

    async def never(scope, receive, send) -> None:
        raise AssertionError("never admitted")

    async def receive() -> dict:
        reads.append(1)
        await asyncio.Event().wait()  # headers only: the body never comes
        return {}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = AdmissionMiddleware(never, max_in_flight=8, body_timeout=60.0, max_buffered_bytes=1024)
    middleware.buffered = 1000
    waiting = asyncio.create_task(middleware(asgi_post(CLASSIFY, DIGIT_7), receive, send))
    await until(lambda: middleware._waiting)
    lifecycle.request_shutdown()
    try:
        await asyncio.wait_for(waiting, 5)
    finally:
        lifecycle.clear_shutdown()
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 503 and headers[b"connection"] == b"close" and reads == []  # not drained


async def test_a_content_length_of_thousands_of_digits_is_no_500() -> None:
    # The reviewer: Python refuses int() of more than 4,300 digits, which httptools lets through;
    # every route answered 500 with a traceback.
    from service.http.lifetime import OVERLONG, content_length

    assert content_length(b"0" * 5000 + b"1") == 1 and content_length("9" * 19) == OVERLONG
    assert content_length(b"12abc") is None and content_length("") is None and content_length("\u0661") is None
    async with running_app() as client:
        listed = await client.get("/v1/models", headers={"content-length": "0" * 5000})
        huge = await client.post(
            CLASSIFY, content=DIGIT_7, headers={"content-length": "9" * 5000, "content-type": "image/png"}
        )
    assert listed.status_code == 200
    assert huge.status_code == 413 and "more than 10**18" in huge.json()["detail"]


async def test_an_inflated_v2_body_counts_at_its_inflated_size_in_the_budget() -> None:
    # Admission counted a compressed /v2 body at its compressed size: gzip's 1,000:1 let requests that
    # each fit the budget hold a thousand times it once inflated. The inflated bytes count now.
    import gzip

    import orjson

    from tests.service.helpers import INFER, digit_tensor, json_request

    body = orjson.dumps(json_request(digit_tensor(DIGIT_7))) + b" " * 100_000  # JSON allows the spaces
    compressed = gzip.compress(body)
    assert len(compressed) + len(DIGIT_7) < 2000 < len(body)
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with running_app(max_buffered_bytes=2000, max_in_flight=64) as client:
        alone = await client.post(INFER, content=compressed, headers=headers)
        assert alone.status_code == 200, alone.text  # one request alone always gets in
        held = HeldRequest(client.app)  # another request holds its 235 bytes
        await until(lambda: held.body_reads == 1)
        refused = await client.post(INFER, content=compressed, headers=headers)
        assert refused.status_code == 503 and "PATCHSERVE_MAX_BUFFERED_BYTES" in refused.json()["error"]
        assert refused.headers["Retry-After"] == "1"
        held.release()
        await asyncio.wait_for(held.task, 10)
        assert held.status == 200
        again = await client.post(INFER, content=compressed, headers=headers)
        assert again.status_code == 200, again.text  # the refused request's bytes were given back
