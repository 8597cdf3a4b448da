"""A full batch waits behind a running one (RunnerPool.stage): it starts in the runner's thread
the moment that run returns, without a trip through the event loop; the last check before compute
moves into the runner's thread with it.

Same manual clock and fake models as test_batcher.py (fakes.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client import REGISTRY

from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig
from service.batching.runners import RunnerPool
from service.core.errors import DeadlineExceeded, InferenceFailed, Unavailable
from tests.service.batching.fakes import (
    HANG_GUARD,
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


@dataclass
class Staged:
    batcher: Batcher
    model: FakeModel
    clock: ManualClock
    plug: asyncio.Future  # request 99, running
    staged: asyncio.Future  # the request staged behind it


@asynccontextmanager
async def staged_behind_plug(ident: int = 1, **submit: float) -> AsyncIterator[Staged]:
    """One runner (max_batch_size 1) busy with the plug until the block ends, request ``ident`` staged behind it."""
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=1) as batcher, busy_runner(batcher, model) as plug:
        staged = asyncio.ensure_future(batcher.submit(item(ident), **submit))
        await settle()
        assert batcher.staged_batches == 1 and batcher.queued == 0
        yield Staged(batcher, model, clock, plug, staged)


def test_room_behind_only_when_no_instance_is_idle_and_one_runs_a_single_batch() -> None:
    pool = RunnerPool(2)
    first = pool.take(1, queued=5)
    assert not pool.room_behind()  # an instance is idle: a batch takes it instead
    second = pool.take(1, queued=5)
    assert (first, second) == (0, 1) and pool.room_behind()
    assert pool.stage() == 0  # the instance whose run began first
    assert pool.stage() == 1 and not pool.room_behind()  # one batch at most behind each
    pool.give_back(0)  # its first run ended: the staged one runs now, the newest run
    assert pool.room_behind() and not pool.available()
    pool.give_back(1)
    assert pool.stage() == 0 and pool.stage() == 1 and pool.staged_batches == 4
    for runner in (0, 1, 0, 1):
        pool.give_back(runner)
    assert pool.available() and not pool.room_behind()


def test_no_room_behind_the_wide_runner_or_a_claimed_instance() -> None:
    pool = RunnerPool(1, wide=True)
    assert pool.take(1, queued=0) == 1  # alone, every instance idle: the wide runner
    assert not pool.available() and not pool.room_behind()  # nothing runs beside it, nothing waits behind it
    pool.give_back(1)
    claimed = pool.claim_alone()
    assert claimed == 1  # the wide one again, for a lone request's claim
    pool.give_back(1, claim=True)
    one = RunnerPool(2)
    assert one.claim_alone() == 0 and one.take(1, queued=3) == 1
    assert one.stage() == 1  # behind the batch, never behind the claim (it runs in a decode thread)
    assert not one.room_behind()
    one.give_back(0, claim=True)
    assert one.available()


async def test_a_staged_batch_starts_in_the_runners_thread_while_the_event_loop_is_blocked() -> None:
    """The second batch starts while this test holds the event loop: nothing but the runner's own
    thread can have started it (before staging, it waited for the loop to hand it over)."""
    first_may_end, second_started = threading.Event(), threading.Event()
    seen: list[int] = []

    def run(x: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(int(x[0, 0, 0, 0]))
        if seen[-1] == 1:
            first_may_end.wait(HANG_GUARD)
        else:
            second_started.set()
        return {"id": x[:, :1, 0, 0].copy()}

    config = BatchingConfig(max_batch_size=1, max_queue_delay=0.5, queue_size=16)
    batcher = Batcher(run, config, model=f"fake-{next(_names)}", clock=ManualClock())
    await batcher.start()
    try:
        a = asyncio.ensure_future(batcher.submit(item(1)))
        await until(lambda: seen == [1])
        b = asyncio.ensure_future(batcher.submit(item(2)))
        await settle()
        assert batcher.queued == 0 and batcher.staged_batches == 1  # handed to the busy runner already
        first_may_end.set()
        assert second_started.wait(HANG_GUARD)  # blocks the loop: the runner's thread went on alone
        assert ids(await result(asyncio.gather(a, b))) == [1, 2]
        assert released(batcher) == {"size": 2, "delay": 0, "idle": 0}
    finally:
        first_may_end.set()
        await batcher.stop()


async def test_a_batch_that_could_still_grow_waits_for_an_idle_runner_instead() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=2) as batcher:
        async with busy_runner(batcher, model) as plug:
            alone = asyncio.ensure_future(batcher.submit(item(1)))
            await settle()
            assert batcher.queued == 1 and batcher.staged_batches == 0  # not full: it may still grow
            mate = asyncio.ensure_future(batcher.submit(item(2)))
            await settle()
            assert batcher.queued == 0 and batcher.staged_batches == 1  # full now: behind the plug
        assert ids(await result(asyncio.gather(plug, alone, mate))) == [99, 1, 2]
        assert model.batches == [[99], [1, 2]]


async def test_a_staged_batch_is_queued_until_its_run_begins() -> None:
    async with staged_behind_plug() as s:
        s.clock.advance(0.25)  # the plug runs on
        s.model.gate.set()
        answers = await result(asyncio.gather(s.plug, s.staged))
    assert answers[1].queue_seconds == pytest.approx(0.25)  # waited until the plug's run ended
    assert answers[1].compute_seconds == 0.0


async def test_a_staged_request_whose_client_left_is_never_run() -> None:
    async with staged_behind_plug() as s:
        s.staged.cancel()
        later = asyncio.ensure_future(s.batcher.submit(item(2)))  # queued: the runner has one behind it
        await settle()
        assert s.batcher.queued == 1
        s.model.gate.set()
        assert ids(await result(asyncio.gather(s.plug, later))) == [99, 2]  # the staged job ended before it
    assert s.model.batches == [[99], [2]] and s.staged.cancelled()


async def test_a_staged_request_past_its_deadline_when_its_run_begins_gets_504_and_is_not_run() -> None:
    async with staged_behind_plug(deadline=0.25) as s:
        s.clock.jump(0.5)  # past its deadline while it waits behind the plug; no timer takes it back
        s.model.gate.set()
        answers = await result(asyncio.gather(s.plug, s.staged, return_exceptions=True))
    assert ids([answers[0]]) == [99] and isinstance(answers[1], DeadlineExceeded)
    assert s.model.batches == [[99]]


async def test_with_two_instances_each_takes_one_batch_behind_it_and_the_rest_wait() -> None:
    first, second = FakeModel(), FakeModel()
    first.gate.clear()
    second.gate.clear()
    async with running_instances([first, second], ManualClock(), max_batch_size=1) as batcher:
        futures = [asyncio.ensure_future(batcher.submit(item(0)))]
        await until(lambda: len(first.batches) == 1)
        futures.append(asyncio.ensure_future(batcher.submit(item(1))))
        await until(lambda: len(second.batches) == 1)
        futures += [asyncio.ensure_future(batcher.submit(item(i))) for i in (2, 3, 4)]
        await settle()
        # 2 waits behind the first instance (the older run), 3 behind the second; 4 is queued
        assert batcher.staged_batches == 2 and batcher.queued == 1
        second.gate.set()
        assert ids(await result(asyncio.gather(futures[1], futures[3], futures[4]))) == [1, 3, 4]
        assert second.batches == [[1], [3], [4]]  # 4 went to the instance that came free
        first.gate.set()
        assert ids(await result(asyncio.gather(futures[0], futures[2]))) == [0, 2]
        assert first.batches == [[0], [2]]


# Found by a review of the first version (each failed on it).


class LoopKiller(BaseException):
    """Not an Exception: a run raising it kills the batching loop."""


async def test_after_a_run_kills_the_loop_the_batch_staged_behind_it_never_runs_and_gets_503() -> None:
    async with staged_behind_plug() as s:
        s.model.fail_with = LoopKiller()  # the plug's run raises it once the gate opens
        s.model.gate.set()
        outcomes = await result(asyncio.gather(s.plug, s.staged, return_exceptions=True))
        await until(lambda: not s.batcher.running)
    assert s.model.batches == [[99]]  # the thread did not go on to the staged batch
    assert isinstance(outcomes[0], InferenceFailed) and isinstance(outcomes[1], Unavailable)
    assert "stopped before this request ran" in outcomes[1].detail


def batch_size_count(batcher: Batcher) -> float:
    model, version = batcher.name.split("/")
    labels = {"model": model, "version": version}
    return REGISTRY.get_sample_value("patchserve_batch_size_count", labels) or 0.0


async def test_a_staged_batch_emptied_by_the_last_check_is_not_counted_as_a_batch() -> None:
    async with staged_behind_plug() as s:
        s.staged.cancel()
        late = asyncio.ensure_future(s.batcher.submit(item(2), deadline=0.25))  # queued: one behind already
        await settle()
        s.clock.jump(0.5)
        s.model.gate.set()
        answers = await result(asyncio.gather(s.plug, late, return_exceptions=True))
        assert ids([answers[0]]) == [99] and isinstance(answers[1], DeadlineExceeded)
        assert s.model.batches == [[99]]
        assert released(s.batcher)["size"] == 1 and batch_size_count(s.batcher) == 1  # the one that ran


async def test_a_run_raising_cancelled_error_is_a_failed_run_not_a_request_left_unanswered() -> None:
    model, clock = FakeModel(), ManualClock()  # (this hung before staging too: the task ended as cancelled)
    async with running(model, clock, max_batch_size=1) as batcher:
        model.fail_with = asyncio.CancelledError()
        with pytest.raises(InferenceFailed, match="CancelledError"):
            await result(batcher.submit(item(1)))
        assert ids([await result(batcher.submit(item(2)))]) == [2]  # the loop goes on
