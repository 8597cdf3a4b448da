"""A lone request's claim on a runner (service/batching/alone.py): taken only when the batcher is idle,
taken back while its image still decodes if another input needs a runner, exclusive of every batch
once its run has started, run from another thread, counted as a batch of one, given back.

Same manual clock and fake models as test_batcher.py (fakes.py). The claim is run with
``asyncio.to_thread``, as the decode pool runs it.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import REGISTRY

from service.batching.alone import MAX_PIXELS, LoneRun
from service.batching.batcher import Batcher
from service.batching.clock import MonotonicClock
from service.batching.config import BatchingConfig, InferenceResult
from service.core.errors import InferenceFailed, Unavailable
from tests.service.batching import fakes
from tests.service.batching.fakes import FakeModel, ManualClock, ids, item, result

pytestmark = pytest.mark.anyio


class MaskedModel(FakeModel):
    """A fake detector taking (batch, mask): records the mask; returns each row's id and mask sum."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[np.ndarray] = []

    def __call__(self, x: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:  # type: ignore[override]
        assert mask is not None, "a bucketed batch comes with its mask"
        self.masks.append(mask.copy())
        self.batches.append([int(v) for v in x[:, 0, 0, 0]])
        return {"id": x[:, :1, 0, 0].copy(), "valid": mask.sum(axis=(1, 2))}


def running(models: list[FakeModel], wide: FakeModel | None = None, clock: ManualClock | None = None):
    return fakes.running_instances(models, clock, wide)


def compute_count(batcher: Batcher) -> float:
    model, version = batcher.name.split("/")
    labels = {"model": model, "version": version}
    return REGISTRY.get_sample_value("patchserve_compute_duration_seconds_count", labels) or 0.0


async def run_claim(claim: LoneRun, x: np.ndarray, bucket: tuple[int, int] | None = None):
    """Run the claim in a thread, as the decode pool does, and release it when the thread ends."""
    try:
        return await result(asyncio.to_thread(claim, x, bucket, float("inf")))
    finally:
        claim.release()


async def test_a_claim_runs_the_wide_runner_in_the_callers_thread_and_counts_as_a_batch_of_one() -> None:
    first, second, wide = FakeModel(), FakeModel(), FakeModel()
    async with running([first, second], wide) as batcher:
        before, computed = fakes.released(batcher), compute_count(batcher)
        claim = batcher.claim_alone()
        assert claim is not None
        answer = await run_claim(claim, item(7))
        assert isinstance(answer, InferenceResult) and ids([answer]) == [7]
        assert (answer.batch_size, answer.queue_seconds) == (1, 0.0)
        assert wide.batches == [[7]] and first.batches == second.batches == []  # every core for it
        assert fakes.released(batcher)["idle"] == before["idle"] + 1 and compute_count(batcher) == computed + 1
        assert batcher.wide_batches == 1
        assert ids([await result(batcher.submit(item(8)))]) == [8]  # given back: the batching path goes on
        assert wide.batches == [[7], [8]]


async def test_no_claim_while_anything_is_queued_on_its_way_or_claimed() -> None:
    only = FakeModel()
    async with running([only]) as batcher:
        only.gate.clear()
        queued = [asyncio.ensure_future(batcher.submit(item(i))) for i in (0, 1, 2)]  # two run, one queues
        await fakes.until(lambda: only.batches == [[0, 1]])
        await fakes.settle()
        assert batcher.queued == 1 and batcher.claim_alone() is None  # queued
        only.gate.set()
        assert ids(await result(asyncio.gather(*queued))) == [0, 1, 2]
        with batcher.arriving(1), batcher.arriving(1):
            assert batcher.claim_alone() is None  # another request is being decoded beside the caller's
        claim = batcher.claim_alone()
        assert claim is not None and batcher.claim_alone() is None  # held: the one runner is taken
        claim.release()
        claim.release()  # idempotent: given back once
        again = batcher.claim_alone()
        assert again is not None
        again.release()
        await batcher.stop()
        assert batcher.claim_alone() is None  # the loop stopped


async def test_while_the_wide_runner_runs_for_a_claim_a_queued_request_waits_then_runs() -> None:
    first, wide = FakeModel(), FakeModel()
    async with running([first], wide) as batcher:
        await fakes.settle()  # the loop waits for a batch with the instance idle
        claim = batcher.claim_alone()
        assert claim is not None
        wide.gate.clear()
        held = asyncio.ensure_future(run_claim(claim, item(0)))
        await fakes.until(lambda: wide.batches == [[0]])  # its run has started: the claim holds
        later = asyncio.ensure_future(batcher.submit(item(1)))
        await fakes.settle()
        assert first.batches == [] and batcher.queued == 1 and batcher.running  # the claim has every core
        wide.gate.set()
        assert ids([await result(held)]) == [0]
        assert ids([await result(later)]) == [1] and wide.batches == [[0], [1]]


async def test_a_claim_whose_image_is_still_decoding_is_taken_back_for_a_queued_input() -> None:
    first, wide = FakeModel(), FakeModel()
    async with running([first], wide) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        assert ids([await result(batcher.submit(item(1)))]) == [1]  # decoded first: it does not wait
        assert await run_claim(claim, item(0)) is None  # taken back: its input goes the batching way
        assert wide.batches == [[1]] and batcher.wide_batches == 1 and fakes.released(batcher)["idle"] == 1


async def test_a_claim_still_decoding_is_taken_back_when_another_request_arrives() -> None:
    first, wide = FakeModel(), FakeModel()
    async with running([first], wide) as batcher:
        with batcher.arriving(1):
            claim = batcher.claim_alone()  # the caller's own input is on its way: it may claim
            assert claim is not None
            with batcher.arriving(1):  # another request starts decoding: the first is not alone any more
                assert await run_claim(claim, item(0)) is None  # taken back: it will be queued once decoded
        assert wide.batches == [] and batcher.wide_batches == 0


async def test_a_claim_of_an_instance_leaves_the_others_to_the_batches() -> None:
    first, second = FakeModel(), FakeModel()
    async with running([first, second]) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        first.gate.clear()  # the claim's run holds the first instance
        held = asyncio.ensure_future(run_claim(claim, item(0)))
        await fakes.until(lambda: first.batches == [[0]])
        assert ids([await result(batcher.submit(item(1)))]) == [1]  # the other instance runs a batch meanwhile
        assert second.batches == [[1]] and not held.done()
        first.gate.set()
        assert ids([await result(held)]) == [0]


async def test_a_padded_input_runs_with_its_bucket_and_pixel_mask() -> None:
    model = MaskedModel()
    async with running([model]) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        answer = await run_claim(claim, item(3, (1, 2, 3)), bucket=(4, 4))
        assert isinstance(answer, InferenceResult) and int(answer.outputs["valid"]) == 6
        assert model.masks[0].shape == (1, 4, 4) and model.masks[0][0, :2, :3].all()


async def test_a_failing_run_is_a_500_and_the_loop_goes_on() -> None:
    model = FakeModel()
    async with running([model]) as batcher:
        model.fail_with = RuntimeError("CUDA error: out of memory")
        claim = batcher.claim_alone()
        assert claim is not None
        answer = await run_claim(claim, item(0))
        assert isinstance(answer, InferenceFailed) and "the run failed for this batch of 1" in answer.detail
        assert "out of memory" in answer.detail
        assert fakes.released(batcher)["idle"] == 1  # counted as a failed batch is (as the batching path counts it)
        assert batcher.running and ids([await result(batcher.submit(item(1)))]) == [1]


class LoopKiller(BaseException):
    """Not an Exception: as from a batch, it ends the batching loop."""


async def test_what_is_not_an_exception_kills_the_loop_as_from_a_batch() -> None:
    model = FakeModel()
    async with running([model]) as batcher:
        model.fail_with = LoopKiller()
        claim = batcher.claim_alone()
        assert claim is not None
        answer = await run_claim(claim, item(0))
        assert isinstance(answer, InferenceFailed) and "batching loop died" in answer.detail
        await fakes.until(lambda: not batcher.running)
        with pytest.raises(Unavailable, match="batching loop is not running"):
            await batcher.submit(item(1))


async def test_giving_up_returns_the_runner_before_the_thread_ends() -> None:
    first, wide = FakeModel(), FakeModel()
    async with running([first], wide) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None and not claim.affordable(MAX_PIXELS + 1) and claim.affordable(MAX_PIXELS)
        await asyncio.to_thread(claim.give_up)  # from the decode thread: scheduled on the loop
        await fakes.settle()
        assert ids([await result(batcher.submit(item(1)))]) == [1]  # the runner is free again
        claim.release()  # the thread's end: nothing more to give back
        assert ids([await result(batcher.submit(item(2)))]) == [2] and wide.batches == [[1], [2]]
        assert batcher.wide_batches == 2 and fakes.released(batcher)["idle"] == 2  # the claim ran nothing: not counted


async def test_an_abandoned_or_expired_request_is_never_run() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running([model], clock=clock) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        claim.abandon()  # its 504 was sent, or its client left, while it decoded
        assert await run_claim(claim, item(0)) is None
        late = batcher.claim_alone()
        assert late is not None
        clock.jump(5.0)
        assert await result(asyncio.to_thread(late, item(1), None, 5.0)) is None  # at its deadline
        late.release()
        assert model.batches == [] and fakes.released(batcher)["idle"] == 0 and compute_count(batcher) == 0


async def test_the_loop_waits_without_spinning_while_a_claim_is_held() -> None:
    model = FakeModel()
    config = BatchingConfig(max_batch_size=4, max_queue_delay=0.001, queue_size=16, request_timeout=30.0)
    batcher = Batcher(model, config, model=f"fake-{next(fakes._names)}", version="1", clock=MonotonicClock())
    await batcher.start()
    try:
        await fakes.settle()  # the idle loop waits for a batch
        claim = batcher.claim_alone()
        assert claim is not None
        model.gate.clear()
        held = asyncio.ensure_future(run_claim(claim, item(0)))
        await fakes.until(lambda: model.batches == [[0]])  # its run has started: the claim holds
        looks = 0
        head_batch = batcher._queue.head_batch

        def counted(size: int):
            nonlocal looks
            looks += 1
            return head_batch(size)

        batcher._queue.head_batch = counted  # type: ignore[method-assign]
        queued = asyncio.ensure_future(batcher.submit(item(7)))  # a /v2 row, say, while the claim is held
        await asyncio.sleep(0.05)  # past its max_queue_delay many times over
        assert looks <= 2, looks  # woken by its arrival, then by nothing until the claim ends
        model.gate.set()
        assert ids([await result(held)]) == [0] and ids([await result(queued)]) == [7]
    finally:
        await batcher.stop()


async def test_stop_waits_for_a_claimed_run_and_takes_back_a_claim_still_decoding() -> None:
    model = FakeModel()
    async with running([model]) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        model.gate.clear()
        held = asyncio.ensure_future(run_claim(claim, item(0)))
        await fakes.until(lambda: model.batches == [[0]])
        stopping = asyncio.ensure_future(batcher.stop())
        await fakes.settle()
        assert not stopping.done()  # the decode thread still runs the session: it is not dropped under it
        model.gate.set()
        await result(stopping)
        assert ids([await result(held)]) == [0]
    other = FakeModel()
    async with running([other]) as batcher:
        claim = batcher.claim_alone()
        assert claim is not None
        await result(batcher.stop())  # still decoding: taken back, nothing to wait for
        assert await run_claim(claim, item(1)) is None and other.batches == []
