"""Batching through the HTTP API, on the committed vit-digits ONNX graph.

The runner is the real ONNX Runtime session, wrapped to record the batch size of every call and,
when a test closes its gate, to keep the runner busy, so that requests can be made to queue
behind it without relying on timing.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import numpy as np
import pytest
import uvicorn

from service.http.app import create_app
from tests.conftest import MODEL_REPOSITORY, free_port, make_settings, png_bytes, running_app
from tests.service.helpers import asgi_post, assert_problem, sample
from tests.service.pipeline.recorded_runner import HANG_GUARD, RecordedRunner, batcher_of, one_of_each, until

pytestmark = pytest.mark.anyio


CLASSIFY = "/v1/models/vit-digits/classify"


def grew(before: str, after: str, name: str, **labels: str) -> float:
    """How much a series grew between two /metrics texts."""
    labels = {"model": "vit-digits", "version": "1", **labels}
    return sample(after, name, **labels) - sample(before, name, **labels)


async def classify(client: httpx.AsyncClient, png: bytes, headers: dict | None = None, **kwargs) -> httpx.Response:
    return await client.post(CLASSIFY, content=png, headers={"content-type": "image/png", **(headers or {})}, **kwargs)


async def test_eight_digits_posted_together_share_one_run_and_each_equals_its_answer_alone(
    digits_test_split, monkeypatch
) -> None:
    runner = RecordedRunner(monkeypatch)
    pngs = one_of_each(digits_test_split, range(8))
    async with running_app(max_batch_size=8) as client:
        before = (await client.get("/metrics")).text
        runner.calls.clear()  # forget the warm-up runs
        plug = await runner.plug(client, one_of_each(digits_test_split, range(9, 10))[0])
        posted = [asyncio.ensure_future(classify(client, png)) for png in pngs]
        await until(lambda: batcher_of(client).queued == 8)
        runner.gate.set()
        together = await asyncio.wait_for(asyncio.gather(*posted), HANG_GUARD)
        assert (await plug).status_code == 200
        assert runner.calls == [1, 8]  # the plug, then all eight in one ONNX Runtime call
        after = (await client.get("/metrics")).text
        alone = [await classify(client, png) for png in pngs]
        assert runner.calls == [1, 8] + [1] * 8
    assert all(r.status_code == 200 for r in together + alone)
    assert [r.json() for r in together] == [r.json() for r in alone]
    assert [r.json()["predictions"][0]["label"] for r in together] == [str(d) for d in range(8)]
    assert all("queue;dur=" in r.headers["server-timing"] for r in together)
    released = [grew(before, after, "patchserve_batches_total", reason=r) for r in ("idle", "size", "delay")]
    assert released == [1, 1, 0]  # the plug alone at an idle runner, then the eight by size


@pytest.mark.parametrize(
    ("params", "headers"),
    [
        ({"timeout": "0"}, {}),
        ({"timeout": "-1"}, {}),
        ({"timeout": "abc"}, {}),
        ({"timeout": "nan"}, {}),
        ({"timeout": "inf"}, {}),
        ({}, {"X-Request-Timeout": "soon"}),
        ({}, {"X-Request-Timeout": "0"}),
        ({"timeout": "1_0"}, {}),  # a tester's: read as 10 (Python's digit grouping)
        ({}, {"X-Request-Timeout": "1_0"}),
    ],
)
async def test_a_requested_timeout_that_is_not_a_number_above_0_is_422(params, headers) -> None:
    digit = png_bytes(np.zeros((8, 8), np.uint8))
    async with running_app() as client:
        response = await classify(client, digit, params=params, headers=headers)
    assert_problem(response, 422, "timeout")


async def test_of_several_timeout_headers_the_shortest_counts_and_each_is_checked() -> None:
    # Found by a fresh user: the first X-Request-Timeout won, so a gateway's tighter one after the client's
    # was ignored (30 then 1e-9: 200; 1e-9 then 30: 504)
    digit = png_bytes(np.zeros((8, 8), np.uint8))
    async with running_app() as client:
        answers = []
        for values in (("30", "1e-9"), ("1e-9", "30"), ("30", "soon"), ("30", "20"), ("30", "2_0")):
            headers = [("X-Request-Timeout", value) for value in values]
            answers.append(await client.post(CLASSIFY, files={"image": digit}, headers=headers))
        v2 = await client.post(
            "/v2/models/vit-digits/infer",
            json={"inputs": [{"name": "pixel_values", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.0] * 64}]},
            headers=[("X-Request-Timeout", "30"), ("X-Request-Timeout", "1e-9")],
        )
    assert [a.status_code for a in answers] == [504, 504, 422, 200, 422]
    assert_problem(answers[2], 422, "x-request-timeout")
    assert v2.status_code == 504 and "error" in v2.json()


async def test_a_request_queued_past_its_requested_timeout_is_504_and_never_run(digits_test_split, monkeypatch) -> None:
    runner = RecordedRunner(monkeypatch)
    first, second, third = one_of_each(digits_test_split, range(3))
    async with running_app(request_timeout=HANG_GUARD) as client:
        batcher = batcher_of(client)
        before = (await client.get("/metrics")).text
        runner.calls.clear()
        plug = await runner.plug(client, first)
        # The server's request_timeout is 0.2 s only while the plug holds the runner: with 0.2 s from
        # the start, a busy machine could time the plug or the last request out before they ran.
        monkeypatch.setattr(batcher, "config", batcher.config.override(request_timeout=0.2))
        by_query = await classify(client, second, params={"timeout": "0.05"})
        by_header = await classify(client, second, headers={"X-Request-Timeout": "0.05"})
        asked_longer = await classify(client, third, params={"timeout": "3600"})  # the server's 0.2 s still holds
        monkeypatch.setattr(batcher, "config", batcher.config.override(request_timeout=HANG_GUARD))
        runner.gate.set()
        assert (await plug).status_code == 200
        after_plug = await classify(client, third)
        after = (await client.get("/metrics")).text
    for response in (by_query, by_header, asked_longer):
        assert_problem(response, 504, "deadline passed")
    assert after_plug.status_code == 200
    assert runner.calls == [1, 1]  # the plug and the last request; none of the three expired ones
    assert grew(before, after, "patchserve_requests_total", outcome="timeout") == 3


async def test_a_full_queue_answers_503_with_retry_after(digits_test_split, monkeypatch) -> None:
    runner = RecordedRunner(monkeypatch)
    first, second, third = one_of_each(digits_test_split, range(3))
    async with running_app(queue_size=1) as client:
        plug = await runner.plug(client, first)
        waiting = asyncio.ensure_future(classify(client, second))
        await until(lambda: batcher_of(client).queued == 1)
        refused = await classify(client, third)
        runner.gate.set()
        assert (await plug).status_code == 200 and (await waiting).status_code == 200
    assert_problem(refused, 503, "queue is full")
    assert refused.headers["retry-after"] == "1"


async def test_a_client_that_disconnects_while_queued_is_dropped_and_counted_cancelled(
    digits_test_split, monkeypatch
) -> None:
    runner = RecordedRunner(monkeypatch)
    first, second = one_of_each(digits_test_split, range(2))
    gone = asyncio.Event()
    messages = [{"type": "http.request", "body": second, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async with running_app() as client:
        before = (await client.get("/metrics")).text
        runner.calls.clear()
        plug = await runner.plug(client, first)
        call = asyncio.ensure_future(client.app(asgi_post(CLASSIFY, second), receive, send))
        await until(lambda: batcher_of(client).queued == 1)
        gone.set()
        await asyncio.wait_for(call, HANG_GUARD)
        assert batcher_of(client).queued == 0  # its place was given back before the runner freed up
        runner.gate.set()
        assert (await plug).status_code == 200
        assert (await classify(client, second)).status_code == 200
        after = (await client.get("/metrics")).text
    assert runner.calls == [1, 1]  # the plug and the last request; never the one whose client left
    assert sent[0]["status"] == 499
    assert grew(before, after, "patchserve_requests_total", outcome="cancelled") == 1
    assert sample(after, "patchserve_queue_depth", model="vit-digits", version="1") == 0


async def test_a_real_connection_closed_while_queued_is_dropped(digits_test_split, monkeypatch) -> None:
    """The same through uvicorn and a TCP socket: the server, not a test, sends http.disconnect."""
    runner = RecordedRunner(monkeypatch)
    first, second = one_of_each(digits_test_split, range(2))
    port = free_port()
    app = create_app(make_settings())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=HANG_GUARD) as client:
            await until(lambda: server.started)
            for _ in range(int(HANG_GUARD / 0.01)):
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            batcher = app.state.server.repository.get("vit-digits").batcher
            runner.calls.clear()
            plug = await runner.plug(client, first)
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            head = f"POST {CLASSIFY} HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: {len(second)}"
            writer.write(head.encode() + b"\r\n\r\n" + second)
            await writer.drain()
            await until(lambda: batcher.queued == 1)
            writer.close()
            await until(lambda: batcher.queued == 0)
            runner.gate.set()
            assert (await plug).status_code == 200
            assert runner.calls == [1]
            metrics = (await client.get("/metrics")).text
        assert sample(metrics, "patchserve_requests_total", model="vit-digits", outcome="cancelled") >= 1
    finally:
        runner.gate.set()
        server.should_exit = True
        await asyncio.wait_for(serving, HANG_GUARD)


class LoopKiller(BaseException):
    """Not an Exception: escapes the batch's own error handling and ends the batching loop."""


async def test_when_the_batching_loop_dies_readyz_turns_503_and_requests_are_answered(
    digits_test_split, monkeypatch
) -> None:
    runner = RecordedRunner(monkeypatch)
    (digit,) = one_of_each(digits_test_split, range(1))
    async with running_app() as client:
        runner.fail_with = LoopKiller()
        in_flight = await classify(client, digit)
        ready = await client.get("/readyz")
        later = await classify(client, digit)
    assert_problem(in_flight, 500, "batching loop died")
    assert_problem(ready, 503, "vit-digits/1: its batching loop has stopped")
    assert_problem(later, 503, "batching loop is not running")
    assert later.headers["retry-after"] == "1"


async def test_a_manifest_batching_section_overrides_the_settings_and_the_listing_shows_the_result(tmp_path) -> None:
    folder = tmp_path / "vit-digits" / "1"
    shutil.copytree(MODEL_REPOSITORY / "vit-digits" / "1", folder)
    manifest = json.loads((folder / "model.json").read_text())
    manifest["batching"] = {"max_batch_size": 3, "request_timeout": 5}
    (folder / "model.json").write_text(json.dumps(manifest))
    async with running_app(model_repository=tmp_path, max_batch_size=16, queue_size=64) as client:
        version = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
    expected = {"max_batch_size": 3, "max_queue_delay": 0.002, "queue_size": 64, "request_timeout": 5.0}
    assert version["batching"] == expected  # the manifest's values, the settings' for the rest


async def test_a_client_that_disconnects_during_its_upload_is_counted_cancelled(digits_test_split) -> None:
    (png,) = one_of_each(digits_test_split, range(1))
    messages = [
        {"type": "http.request", "body": png[: len(png) // 2], "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async with running_app() as client:
        before = (await client.get("/metrics")).text
        await asyncio.wait_for(client.app(asgi_post(CLASSIFY, png), receive, send), HANG_GUARD)
        after = (await client.get("/metrics")).text
    assert sent[0]["status"] == 499  # nginx's "client closed request", as for a disconnect while queued
    assert grew(before, after, "patchserve_requests_total", outcome="cancelled") == 1
    assert grew(before, after, "patchserve_requests_total", outcome="client_error") == 0
