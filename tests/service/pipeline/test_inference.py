"""A request's path through decode and batching: admitted whole or not at all, fair decoding."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.conftest import running_app
from tests.service.helpers import assert_problem, sample
from tests.service.pipeline.recorded_runner import CLASSIFY, RecordedRunner, batcher_of, one_of_each, until

pytestmark = pytest.mark.anyio


async def test_a_multi_image_request_is_refused_whole_when_the_queue_lacks_room(digits_test_split, monkeypatch) -> None:
    runner = RecordedRunner(monkeypatch)
    pngs = one_of_each(digits_test_split, range(5))
    async with running_app(queue_size=4) as client:
        warm_up_runs = len(runner.calls)
        plug = await runner.plug(client, pngs[0])  # the runner is busy; the queue is empty
        waiting = asyncio.ensure_future(client.post(CLASSIFY, files={"image": pngs[4]}))
        await until(lambda: batcher_of(client).queued == 1)
        before = (await client.get("/metrics")).text
        refused = await client.post(CLASSIFY, files=[("image", p) for p in pngs[:4]])  # 4 images, room for 3
        after = (await client.get("/metrics")).text
        assert batcher_of(client).queued == 1  # none of its images was queued
        fits = asyncio.ensure_future(client.post(CLASSIFY, files=[("image", p) for p in pngs[1:4]]))
        await until(lambda: batcher_of(client).queued == 4)
        runner.gate.set()
        assert (await plug).status_code == 200
        assert (await waiting).json()["predictions"][0]["label"] == "4"
        assert [r["predictions"][0]["label"] for r in (await fits).json()["results"]] == ["1", "2", "3"]
    assert_problem(refused, 503, "room for 3 image(s), it has 4")
    assert refused.headers["retry-after"] == "1"
    labels = {"model": "vit-digits", "version": "1", "outcome": "rejected"}
    name = "patchserve_requests_total"
    assert sample(after, name, **labels) - sample(before, name, **labels) == 1
    assert runner.calls[warm_up_runs:] == [1, 4]  # the refused request's images never ran


async def test_an_admitted_request_is_queued_whole_even_when_another_input_slips_in_first(
    digits_test_split, monkeypatch
) -> None:
    # Found by a tester: another request's input queued between this request's admit() and its
    # images' submits filled the queue, and the request got a 200 holding one image's 503.
    runner = RecordedRunner(monkeypatch)
    pngs = one_of_each(digits_test_split, range(4))
    async with running_app(queue_size=3) as client:
        batcher = batcher_of(client)
        plug = await runner.plug(client, pngs[0])  # the runner is busy; the queue is empty
        admit, admitted, others = batcher.admit, [], []

        def admit_then_slip_one_in(count: int, unit: str = "image(s)") -> None:
            admit(count, unit)
            admitted.append(count)
            if len(admitted) == 2:  # after decoding, just before the three images' submits start
                others.append(asyncio.ensure_future(batcher.submit(np.zeros((1, 8, 8), np.float32))))

        monkeypatch.setattr(batcher, "admit", admit_then_slip_one_in)
        request = asyncio.ensure_future(client.post(CLASSIFY, files=[("image", p) for p in pngs[1:4]]))
        await until(lambda: batcher.queued == 4)  # 3 + the one that slipped in: over queue_size for a moment
        runner.gate.set()
        answer = await request
        plugged = await plug
        assert plugged.status_code == 200 and (await others[0]).outputs, plugged.text
    # the plug's own admit after its lone run, in the queue over-full for that moment: nothing to queue, no 503
    assert admitted == [3, 3, 0]
    assert answer.status_code == 200
    assert [r["predictions"][0]["label"] for r in answer.json()["results"]] == ["1", "2", "3"]


async def test_a_request_larger_than_the_whole_queue_is_a_400_not_a_503_to_retry(digits_test_split) -> None:
    pngs = one_of_each(digits_test_split, range(5))
    async with running_app(queue_size=4) as client:
        response = await client.post(CLASSIFY, files=[("image", p) for p in pngs])
    assert_problem(response, 400, "at most 4 images in one request")
    assert "retry-after" not in response.headers


async def test_one_request_decodes_at_most_decode_parallelism_images_at_once(
    digits_test_split, concurrent_decodes
) -> None:
    pngs = one_of_each(digits_test_split, range(6))
    async with running_app(decode_threads=4) as client:
        assert client.app.state.server.decode_parallelism == 2
        response = await client.post(CLASSIFY, files=[("image", p) for p in pngs])
    assert [r["predictions"][0]["label"] for r in response.json()["results"]] == [str(d) for d in range(6)]
    assert concurrent_decodes.peak == 2
