"""The dynamic batcher on its own: release rules, deadlines, cancellation, isolation.

A manual clock drives time and a fake model records every batch it is given, so no test here
depends on how fast the machine is: time moves only when a test advances it. The real ONNX
graph behind the HTTP API is in tests/service/pipeline/test_batching_http.py; the bounded queue's
refusals in test_queue.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig
from service.core.errors import DeadlineExceeded, InferenceFailed, Unavailable
from tests.service.batching.fakes import (
    FakeModel,
    ManualClock,
    _names,
    busy_runner,
    ids,
    item,
    queue_depth,
    released,
    result,
    running,
    settle,
)

pytestmark = pytest.mark.anyio


# Release: size, delay, idle.


async def test_a_full_batch_leaves_at_once_by_size() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=4) as batcher:
        results = await result(asyncio.gather(*(batcher.submit(item(i)) for i in range(5))))
        assert released(batcher) == {"size": 1, "delay": 0, "idle": 1}
    assert model.batches == [[0, 1, 2, 3], [4]]  # the fifth, then alone, left on the idle path
    assert ids(results) == [0, 1, 2, 3, 4]
    assert [r.batch_size for r in results] == [4, 4, 4, 4, 1]
    assert all(r.queue_seconds == 0.0 for r in results)  # the clock never moved: nobody waited for the delay


async def test_a_lone_request_at_an_idle_runner_leaves_at_once() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_queue_delay=5.0) as batcher:
        (answer,) = [await result(batcher.submit(item(7)))]
        assert released(batcher) == {"size": 0, "delay": 0, "idle": 1}
    assert model.batches == [[7]]
    assert answer.queue_seconds == 0.0 and answer.batch_size == 1
    assert float(answer.outputs["total"]) == 7 * 4


async def test_a_partial_batch_leaves_when_its_oldest_request_has_waited_the_delay() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=8, max_queue_delay=0.5) as batcher:
        first = [asyncio.ensure_future(batcher.submit(item(i))) for i in (0, 1)]  # arrive together
        await settle()
        clock.advance(0.25)
        late = asyncio.ensure_future(batcher.submit(item(2)))
        await settle()
        clock.advance(0.125)
        await settle()
        assert model.batches == [] and batcher.queued == 3  # the oldest has waited 0.375 s of 0.5
        assert released(batcher) == {"size": 0, "delay": 0, "idle": 0}
        clock.advance(0.125)
        results = await result(asyncio.gather(*first, late))
        assert released(batcher) == {"size": 0, "delay": 1, "idle": 0}
    assert model.batches == [[0, 1, 2]]
    assert [r.queue_seconds for r in results] == [0.5, 0.5, 0.25]  # counted from each one's arrival
    assert ids(results) == [0, 1, 2]


# Deadlines and cancellation (the bounded queue's refusals: test_queue.py).


async def test_a_request_still_queued_at_its_deadline_gets_504_and_is_never_run() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_queue_delay=0.5) as batcher:
        async with busy_runner(batcher, model) as plug:
            late = asyncio.ensure_future(batcher.submit(item(1), deadline=clock.now() + 0.25))
            patient = asyncio.ensure_future(batcher.submit(item(2)))
            await settle()
            clock.advance(0.25)
            await settle()
            assert late.done() and not plug.done()  # answered at its deadline, while the runner is still busy
            assert batcher.queued == 1 and queue_depth(batcher) == 1
            clock.advance(0.25)
        await result(asyncio.gather(plug, patient))
        with pytest.raises(DeadlineExceeded) as caught:
            late.result()
    assert model.batches == [[99], [2]]
    assert caught.value.status == 504 and caught.value.outcome == "timeout"
    assert "deadline passed after 0.250 s in the queue" in caught.value.detail


async def test_the_survivor_of_an_expired_pair_leaves_on_the_idle_path() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_queue_delay=5.0) as batcher:
        doomed = asyncio.ensure_future(batcher.submit(item(1), deadline=0.25))
        survivor = asyncio.ensure_future(batcher.submit(item(2)))
        await settle()
        assert model.batches == []  # two queued: waiting for the batch to fill
        clock.advance(0.25)
        assert ids([await result(survivor)]) == [2]
        assert released(batcher) == {"size": 0, "delay": 0, "idle": 1}
        with pytest.raises(DeadlineExceeded):
            await doomed
        with pytest.raises(DeadlineExceeded, match="before it was queued"):
            await batcher.submit(item(3), deadline=clock.now())
    assert model.batches == [[2]]


async def test_a_request_past_its_deadline_when_its_batch_is_taken_is_dropped_even_if_its_timer_is_late() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=2) as batcher:
        async with busy_runner(batcher, model) as plug:
            late = asyncio.ensure_future(batcher.submit(item(1), deadline=0.25))
            on_time = asyncio.ensure_future(batcher.submit(item(2)))
            await settle()
            clock.jump(0.5)  # past the deadline, but its timer has not run yet
        results = await result(asyncio.gather(plug, late, on_time, return_exceptions=True))
        assert released(batcher)["size"] == 1  # both were taken; the last check dropped one
    assert isinstance(results[1], DeadlineExceeded) and ids([results[2]]) == [2]
    assert model.batches == [[99], [2]]


async def test_the_deadline_a_request_asks_for_may_only_shorten_request_timeout() -> None:
    async with running(FakeModel(), ManualClock(), request_timeout=2.0) as batcher:
        assert batcher.deadline() == 2.0
        assert batcher.deadline(0.5) == 0.5
        assert batcher.deadline(60.0) == 2.0


# Failures.


async def test_a_failing_batch_fails_only_its_own_requests_and_the_next_batch_is_served() -> None:
    model, clock = FakeModel(), ManualClock()
    model.fail_with = RuntimeError("CUDA error: out of memory")
    async with running(model, clock, max_batch_size=2) as batcher:
        failed = await result(asyncio.gather(*(batcher.submit(item(i)) for i in (0, 1)), return_exceptions=True))
        after = await result(batcher.submit(item(2)))
        assert batcher.running
    assert all(isinstance(e, InferenceFailed) and e.status == 500 for e in failed)
    assert "the run failed for this batch of 2: RuntimeError: CUDA error: out of memory" in failed[0].detail
    assert ids([after]) == [2]
    assert model.batches == [[0, 1], [2]]


async def test_outputs_that_alias_the_batch_buffer_are_copied_before_the_next_batch_reuses_it() -> None:
    def echo(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"id": x[:, 0, 0, :1]}  # (B, 1): a view of the batch buffer, as a model function may return

    batcher = Batcher(echo, BatchingConfig(4, 0.0, 16), model=f"fake-{next(_names)}")
    await batcher.start()
    try:
        first = await result(batcher.submit(item(1)))
        second = await result(batcher.submit(item(2)))  # stacked into the buffer the first was run from
    finally:
        await batcher.stop()
    assert ids([first, second]) == [1, 2]


async def test_outputs_without_one_row_per_input_fail_the_whole_batch_with_a_500_that_says_so() -> None:
    model, clock = FakeModel(), ManualClock()
    model.rows_missing = 1
    async with running(model, clock, max_batch_size=3) as batcher:
        failed = await result(asyncio.gather(*(batcher.submit(item(i)) for i in (0, 1, 2)), return_exceptions=True))
        model.rows_missing = 0
        assert ids([await result(batcher.submit(item(3)))]) == [3]
    assert all(isinstance(e, InferenceFailed) for e in failed)
    assert all("output 'id' has 2 rows for a batch of 3 inputs" in e.detail for e in failed)


# Shapes and fairness.


async def test_shapes_never_share_a_batch_and_the_oldest_request_leads_the_next_one() -> None:
    small, large = (1, 2, 2), (1, 3, 5)
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, max_batch_size=2) as batcher:
        async with busy_runner(batcher, model) as plug:
            arrivals = [(1, small), (2, large), (3, small), (4, small), (5, small), (6, large)]
            waiting = [asyncio.ensure_future(batcher.submit(item(i, shape))) for i, shape in arrivals]
            await settle()
            clock.advance(0.5)
        results = await result(asyncio.gather(plug, *waiting))
        assert released(batcher) == {"size": 3, "delay": 0, "idle": 1}
    # Each batch is led by the oldest waiting request: 2 (large) runs before 4 and 5, which came after it.
    assert model.batches == [[99], [1, 3], [2, 6], [4, 5]]
    assert ids(results) == [99, 1, 2, 3, 4, 5, 6]
    assert [r.outputs["total"].item() for r in results[1:3]] == [1 * 4, 2 * 15]


# The end of the loop.


class LoopKiller(BaseException):
    """Not an Exception: nothing in the batch's own error handling catches it."""


async def test_a_dead_loop_answers_everyone_stops_running_and_refuses_new_requests() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock) as batcher:
        model.fail_with = LoopKiller()
        async with busy_runner(batcher, model) as plug:
            queued = [asyncio.ensure_future(batcher.submit(item(i))) for i in (1, 2)]
            await settle()
        outcomes = await result(asyncio.gather(plug, *queued, return_exceptions=True))
        assert not batcher.running and batcher.queued == 0 and queue_depth(batcher) == 0
        with pytest.raises(Unavailable, match="not running"):
            await batcher.submit(item(3))
    assert isinstance(outcomes[0], InferenceFailed) and "batching loop died" in outcomes[0].detail
    assert all(isinstance(e, Unavailable) and "stopped before this request ran" in e.detail for e in outcomes[1:])
    assert model.batches == [[99]]


async def test_stop_answers_the_running_batch_and_the_queue_with_503() -> None:
    model, clock = FakeModel(), ManualClock()
    batcher = Batcher(model, BatchingConfig(4, 0.5, 16), model=f"fake-{next(_names)}", clock=clock)
    await batcher.start()
    async with busy_runner(batcher, model) as plug:
        queued = asyncio.ensure_future(batcher.submit(item(1)))
        await settle()
        stopping = asyncio.ensure_future(batcher.stop())
        await settle()
        assert plug.done() and queued.done() and not batcher.running
    await result(stopping)
    assert isinstance(plug.exception(), Unavailable)
    assert "stopped (server shutdown or version unloaded)" in plug.exception().detail
    assert isinstance(queued.exception(), Unavailable)
    assert model.batches == [[99]]


@pytest.mark.parametrize("whole", [True, False])
async def test_the_inputs_of_a_request_admitted_whole_are_never_refused_one_at_a_time(whole: bool) -> None:
    # Found by a tester (queue_size 8, 32 clients of 3 images each): a 200 holding one image's 503.
    # Between admit() and its inputs' submits another request's input can be queued first.
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, queue_size=3, max_batch_size=1) as batcher, busy_runner(batcher, model):
        other = asyncio.ensure_future(batcher.submit(item(1)))  # queued before the three below start
        batcher.admit(3)  # room for all three now
        mine = asyncio.gather(*(batcher.submit(item(i), whole=whole) for i in (2, 3, 4)), return_exceptions=True)
        await settle()
        model.gate.set()
        rows = await result(mine)
        assert int((await result(other)).outputs["id"][0]) == 1
    if whole:  # the queue held 4 of 3 for a moment: the request's last input was already admitted
        assert ids(rows) == [2, 3, 4]
    else:  # submit's own check, for inputs not admitted together
        assert ids(rows[:2]) == [2, 3] and isinstance(rows[2], Unavailable)
