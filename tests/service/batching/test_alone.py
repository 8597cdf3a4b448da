"""The idle fast path: a lone input claims the runner the loop would have given it and runs in one trip.

Same manual clock and fake models as test_batcher.py (fakes.py); the claim's run is called in a
thread, as the decode thread calls it, and its runner given back after, as decode_alone does.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import REGISTRY

from service.batching.alone import Claim
from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig, InferenceResult
from service.core import tracing
from service.core.errors import DeadlineExceeded, InferenceFailed, Unavailable
from tests.service.batching.fakes import (
    FakeModel,
    ManualClock,
    _names,
    busy_runner,
    ids,
    item,
    released,
    result,
    running,
    running_instances,
    settle,
    until,
)

pytestmark = pytest.mark.anyio


async def run_claimed(claim: Claim, x: np.ndarray, deadline: float = 30.0) -> InferenceResult:
    """What decode_alone does with a claim: run in a thread, then give the runner back."""
    try:
        return await result(asyncio.to_thread(claim.run, x, None, deadline))
    finally:
        claim.give_back()


def counts(batcher: Batcher, name: str) -> float:
    """The ``_count`` of one of the batcher's histograms."""
    model, version = batcher.name.split("/")
    return REGISTRY.get_sample_value(f"patchserve_{name}_count", {"model": model, "version": version}) or 0.0


async def test_a_lone_input_at_an_idle_batcher_runs_on_its_claim_and_counts_as_an_idle_batch_of_one() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        await settle()
        claim = batcher.claim_alone()
        assert claim is not None
        answer = await run_claimed(claim, item(7))
        assert ids([answer]) == [7] and float(answer.outputs["total"]) == 28.0  # its row, the batch axis removed
        assert (answer.batch_size, answer.queue_seconds, answer.compute_seconds) == (1, 0.0, 0.0)
        assert model.batches == [[7]]
        assert released(batcher) == {"size": 0.0, "delay": 0.0, "idle": 1.0}
        assert [counts(batcher, n) for n in ("batch_size", "queue_duration_seconds", "compute_duration_seconds")] == [
            1.0,
            1.0,
            1.0,
        ]
        assert ids([await result(batcher.submit(item(8)))]) == [8]  # the runner is back: the loop serves on


async def test_while_a_claim_holds_the_only_runner_the_loop_waits_for_it_then_serves_the_queue() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        await settle()  # the loop is waiting for a request, a runner idle
        claim = batcher.claim_alone()
        assert claim is not None
        assert batcher.claim_alone() is None  # no runner left for a second one
        waiting = asyncio.ensure_future(batcher.submit(item(1)))
        await settle()
        assert batcher.running and batcher.queued == 1 and model.batches == []  # it waits for the runner
        assert ids([await run_claimed(claim, item(0))]) == [0]
        assert ids([await result(waiting)]) == [1]
        assert model.batches == [[0], [1]]
        assert released(batcher)["idle"] == 2.0


async def test_no_claim_unless_the_batcher_is_idle_its_loop_runs_and_tracing_is_off(monkeypatch) -> None:
    model, clock = FakeModel(), ManualClock()
    stopped = Batcher(model, BatchingConfig(4, 0.5, 16), model=f"fake-{next(_names)}", clock=clock)
    assert stopped.claim_alone() is None  # its loop never started
    async with running(model, clock) as batcher:
        async with busy_runner(batcher, model) as plug:
            assert batcher.claim_alone() is None  # the runner is busy
            queued = asyncio.ensure_future(batcher.submit(item(1)))
            await settle()
        await result(plug)
        await result(queued)
        await settle()
        with batcher.arriving(1):
            assert batcher.claim_alone() is None  # another input is on its way
        monkeypatch.setattr(tracing, "enabled", lambda: True)
        assert batcher.claim_alone() is None  # traced requests keep their queue and batch spans
        monkeypatch.undo()
        claim = batcher.claim_alone()
        assert claim is not None
        claim.give_back()


async def test_inputs_waiting_in_the_queue_for_their_batch_to_fill_block_a_claim() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        async with busy_runner(batcher, model) as plug:
            pair = [asyncio.ensure_future(batcher.submit(item(i))) for i in (1, 2)]
            await settle()
        await result(plug)
        await settle()
        assert batcher.queued == 2  # two together wait up to max_queue_delay for more, the runner idle
        assert batcher.claim_alone() is None  # a newcomer would have joined them, not overtaken them
        clock.advance(0.5)
        assert ids(await result(asyncio.gather(*pair))) == [1, 2]
        assert model.batches == [[99], [1, 2]]


async def test_a_claim_takes_the_wide_runner_when_every_instance_is_idle_else_an_idle_instance() -> None:
    first, second, wide = FakeModel(), FakeModel(), FakeModel()
    async with running_instances([first, second], ManualClock(), wide=wide) as batcher:
        await settle()
        claim = batcher.claim_alone()
        assert claim is not None
        assert batcher.claim_alone() is None  # the wide runner has every core: no instance starts
        await run_claimed(claim, item(0))
        assert wide.batches == [[0]] and batcher.wide_batches == 1
        first.gate.clear()
        pair = [asyncio.ensure_future(batcher.submit(item(i))) for i in (1, 2)]  # a full batch: first instance
        await until(lambda: len(first.batches) == 1)
        claim = batcher.claim_alone()
        assert claim is not None
        await run_claimed(claim, item(3))
        assert second.batches == [[3]] and wide.batches == [[0]]  # an instance busy: the other one, never wide
        first.gate.set()
        assert ids(await result(asyncio.gather(*pair))) == [1, 2]


async def test_a_claim_abandoned_or_past_its_deadline_is_never_run_and_its_runner_comes_back() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        assert claim.abandon() is True  # the request stopped waiting while its image was decoded
        with pytest.raises(DeadlineExceeded):
            await run_claimed(claim, item(0))
        claim = batcher.claim_alone()
        assert claim is not None
        clock.jump(5.0)
        with pytest.raises(DeadlineExceeded, match="deadline passed before it ran"):
            await run_claimed(claim, item(1), deadline=5.0)
        assert model.batches == [] and released(batcher)["idle"] == 0.0
        assert ids([await result(batcher.submit(item(2)))]) == [2]


async def test_a_claimed_run_that_started_cannot_be_abandoned_and_finishes() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        model.gate.clear()
        running_run = asyncio.ensure_future(run_claimed(claim, item(4)))
        await until(lambda: len(model.batches) == 1)
        assert claim.abandon() is False
        model.gate.set()
        assert ids([await result(running_run)]) == [4]


async def test_a_claimed_run_that_fails_fails_alone_and_the_loop_goes_on() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        model.fail_with = RuntimeError("boom")
        claim = batcher.claim_alone()
        assert claim is not None
        with pytest.raises(InferenceFailed, match="the run failed for this batch of 1: RuntimeError: boom"):
            await run_claimed(claim, item(0))
        model.rows_missing = 1
        claim = batcher.claim_alone()
        assert claim is not None
        with pytest.raises(InferenceFailed, match="do not match its batch of 1"):
            await run_claimed(claim, item(1))
        model.rows_missing = 0
        assert batcher.running
        assert ids([await result(batcher.submit(item(2)))]) == [2]


class LoopKiller(BaseException):
    pass


async def test_a_claimed_run_that_raises_no_exception_kills_the_loop_as_a_batch_would() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        model.fail_with = LoopKiller()
        claim = batcher.claim_alone()
        assert claim is not None
        with pytest.raises(InferenceFailed, match="batching loop died"):
            await run_claimed(claim, item(0))
        await settle()
        assert not batcher.running
        with pytest.raises(Unavailable, match="not running"):
            await batcher.submit(item(1))


async def test_a_claim_whose_loop_stopped_before_its_run_is_answered_503() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        await batcher.stop()
        with pytest.raises(Unavailable, match="loop stopped"):
            await run_claimed(claim, item(0))
        assert model.batches == []
