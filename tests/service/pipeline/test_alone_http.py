"""The idle fast path through the HTTP API, on the committed vit-digits graph (service.batching.alone).

A request's only image that finds the batcher idle is decoded and run in one trip to a decode
thread; everything a client or an operator sees is what the queue and the loop would have given.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.runtime.sessions import OrtRunner
from service.tasks.classification import Classification
from tests.conftest import running_app
from tests.service.batching.fakes import ManualClock
from tests.service.helpers import asgi_post, sample
from tests.service.pipeline.recorded_runner import (
    CLASSIFY,
    HANG_GUARD,
    LeavingClient,
    RecordedRunner,
    one_of_each,
    stuck_decoding,
    until,
)

pytestmark = pytest.mark.anyio


def grew(before: str, after: str, name: str, **labels: str) -> float:
    labels = {"model": "vit-digits", "version": "1", **labels}
    return sample(after, name, **labels) - sample(before, name, **labels)


def idle(batcher) -> bool:
    """Whether a lone request could claim a runner now (the claim made to ask is given back)."""
    claim = batcher.claim_alone()
    if claim is not None:
        claim.give_back()
    return claim is not None


async def test_a_lone_request_at_an_idle_server_runs_in_its_decode_thread_as_an_idle_batch_of_one(
    digits_test_split, monkeypatch
) -> None:
    threads: list[str] = []
    original = OrtRunner.run

    def run(runner: OrtRunner, batch, *mask):
        threads.append(threading.current_thread().name)
        return original(runner, batch, *mask)

    monkeypatch.setattr(OrtRunner, "run", run)
    pngs = one_of_each(digits_test_split, range(3))
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        threads.clear()  # forget the warm-up runs
        alone = [await client.post(CLASSIFY, files={"image": png}) for png in pngs]
        after = (await client.get("/metrics")).text
        lone_threads = list(threads)
        together = await client.post(CLASSIFY, files=[("image", png) for png in pngs])  # the queue and the loop
    assert [r.status_code for r in alone] == [200] * 3 and together.status_code == 200
    assert [r.json() for r in alone] == together.json()["results"]  # the same answers either way
    assert [r.json()["predictions"][0]["label"] for r in alone] == ["0", "1", "2"]
    assert len(lone_threads) == 3 and all(name.startswith("decode") for name in lone_threads)  # one trip each
    assert not any(name.startswith("decode") for name in threads[3:])  # several images: the runner's thread
    assert grew(before, after, "patchserve_batches_total", reason="idle") == 3
    for name in ("batch_size", "queue_duration_seconds", "compute_duration_seconds", "decode_duration_seconds"):
        assert grew(before, after, f"patchserve_{name}_count") == 3, name
    assert grew(before, after, "patchserve_batch_size_sum") == 3  # batches of one
    assert grew(before, after, "patchserve_requests_total", outcome="success") == 3
    assert sample(after, "patchserve_queue_depth", model="vit-digits", version="1") == 0
    timing = alone[0].headers["server-timing"]
    assert [entry.split(";")[0] for entry in timing.split(", ")] == ["decode", "queue", "compute", "total"]


async def test_a_lone_image_past_its_deadline_while_decoded_is_504_never_run_and_its_runner_comes_back(
    digits_test_split, monkeypatch
) -> None:
    runner = RecordedRunner(monkeypatch)
    (png,) = one_of_each(digits_test_split, range(1))
    async with running_app() as client:
        batcher = client.app.state.server.repository.get("vit-digits").batcher
        runner.calls.clear()
        started, release = stuck_decoding(monkeypatch)
        # the batcher's clock stands still: the deadline can only pass in the decode's wait
        clock, batcher.clock = batcher.clock, ManualClock()
        response = await client.post(CLASSIFY, files={"image": png}, params={"timeout": 0.2})
        await until(started.is_set)
        release.set()
        await until(lambda: idle(batcher))  # the thread ended: its runner came back
        batcher.clock = clock
        later = await client.post(CLASSIFY, files={"image": png})
    assert response.status_code == 504 and "being decoded" in response.json()["detail"]
    assert runner.calls == [1] and later.status_code == 200  # only the later request ran


async def test_a_lone_image_whose_client_left_while_it_was_decoded_is_never_run(digits_test_split, monkeypatch) -> None:
    runner = RecordedRunner(monkeypatch)
    (png,) = one_of_each(digits_test_split, range(1))
    leaving = LeavingClient(png)
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        runner.calls.clear()
        started, release = stuck_decoding(monkeypatch)
        call = asyncio.ensure_future(client.app(asgi_post(CLASSIFY, png), leaving.receive, leaving.send))
        await until(started.is_set)
        leaving.leave()
        await asyncio.wait_for(call, HANG_GUARD)
        release.set()
        batcher = client.app.state.server.repository.get("vit-digits").batcher
        await until(lambda: idle(batcher))  # the thread ended: its runner came back
        after = (await client.get("/metrics")).text
    assert runner.calls == [] and leaving.sent[0]["status"] == 499
    assert grew(before, after, "patchserve_requests_total", outcome="cancelled") == 1
    assert grew(before, after, "patchserve_batches_total", reason="idle") == 0


async def test_a_lone_images_fields_are_computed_in_its_decode_thread_and_on_the_loop_if_they_raise_there(
    digits_test_split, monkeypatch
) -> None:
    threads: list[str] = []
    original = Classification.fields

    def fields(self, model, outcome, params):
        threads.append(threading.current_thread().name)
        if fail_in_thread and threads[-1].startswith("decode"):
            raise RuntimeError("not here")
        return original(self, model, outcome, params)

    monkeypatch.setattr(Classification, "fields", fields)
    (png,) = one_of_each(digits_test_split, range(1))
    async with running_app() as client:
        fail_in_thread = False
        quick = await client.post(CLASSIFY, files={"image": png}, params={"top_k": 2})
        in_thread = list(threads)
        threads.clear()
        fail_in_thread = True
        again = await client.post(CLASSIFY, files={"image": png}, params={"top_k": 2})
    assert len(in_thread) == 1 and in_thread[0].startswith("decode")  # computed once, off the loop
    assert len(threads) == 2 and threads[0].startswith("decode") and not threads[1].startswith("decode")
    assert quick.status_code == again.status_code == 200 and quick.json() == again.json()
    assert [p["label"] for p in quick.json()["predictions"]][:1] == ["0"] and len(quick.json()["predictions"]) == 2
