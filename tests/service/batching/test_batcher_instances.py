"""One batcher feeding several model instances (runners): N batches in flight, and what stays the same.

Same manual clock and fake models as test_batcher.py (fakes.py); each fake model is one instance.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.batching.batcher import Batcher
from service.batching.config import BatchingConfig
from service.core.errors import InferenceFailed, Unavailable
from tests.service.batching.fakes import (
    FakeModel,
    ManualClock,
    _names,
    ids,
    item,
    released,
    result,
    running_instances,
    settle,
    until,
)

pytestmark = pytest.mark.anyio


def running(models: list[FakeModel], clock: ManualClock, wide: FakeModel | None = None, **config: float):
    return running_instances(models, clock, wide, **config)


async def test_two_instances_run_two_batches_at_once() -> None:
    first, second = FakeModel(), FakeModel()
    first.gate.clear()
    second.gate.clear()
    clock = ManualClock()
    async with running([first, second], clock) as batcher:
        assert batcher.instances == 2
        a = [asyncio.ensure_future(batcher.submit(item(i))) for i in (0, 1)]  # a full batch: leaves by size
        await until(lambda: len(first.batches) == 1)
        b = [asyncio.ensure_future(batcher.submit(item(i))) for i in (2, 3)]  # the first runner is busy
        await until(lambda: len(second.batches) == 1)
        assert first.batches == [[0, 1]] and second.batches == [[2, 3]]  # both in flight, neither finished
        assert not any(f.done() for f in a + b)
        c = asyncio.ensure_future(batcher.submit(item(4)))  # both runners busy: it waits
        await settle()
        assert batcher.queued == 1
        second.gate.set()
        assert ids(await result(asyncio.gather(*b))) == [2, 3]
        assert ids([await result(c)]) == [4]  # taken by the runner that came free
        assert second.batches == [[2, 3], [4]]
        first.gate.set()
        assert ids(await result(asyncio.gather(*a))) == [0, 1]
        assert released(batcher) == {"size": 2, "delay": 0, "idle": 1}


async def test_a_runner_stacks_every_batch_into_the_same_preallocated_memory() -> None:
    seen: list[tuple[int, int]] = []  # (runner, address of the batch's first byte)

    def recording(index: int):
        def run(x: np.ndarray) -> dict[str, np.ndarray]:
            seen.append((index, x.__array_interface__["data"][0]))
            return {"id": x[:, :1, 0, 0].copy()}

        return run

    batcher = Batcher([recording(0), recording(1)], BatchingConfig(4, 0.0, 16), model=f"fake-{next(_names)}")
    await batcher.start()
    try:
        for i in range(3):
            await result(batcher.submit(item(i)))
    finally:
        await batcher.stop()
    addresses = {address for _, address in seen}
    assert [index for index, _ in seen] == [0, 0, 0]  # one request at a time: the first idle runner every time
    assert len(addresses) == 1  # the same preallocated memory for every batch of that runner


async def test_a_failing_instance_fails_only_its_batch_and_the_other_keeps_serving() -> None:
    first, second = FakeModel(), FakeModel()
    first.fail_with = RuntimeError("device lost")
    async with running([first, second], ManualClock()) as batcher:
        failed = await result(asyncio.gather(*(batcher.submit(item(i)) for i in (0, 1)), return_exceptions=True))
        ok = await result(asyncio.gather(*(batcher.submit(item(i)) for i in (2, 3))))
        assert batcher.running
    assert all(isinstance(e, InferenceFailed) and "device lost" in e.detail for e in failed)
    assert ids(ok) == [2, 3]


async def test_stop_answers_every_batch_in_flight() -> None:
    first, second = FakeModel(), FakeModel()
    first.gate.clear()
    second.gate.clear()
    batcher = Batcher([first, second], BatchingConfig(1, 0.5, 16), model=f"fake-{next(_names)}", clock=ManualClock())
    await batcher.start()
    in_flight = [asyncio.ensure_future(batcher.submit(item(i))) for i in (0, 1)]
    await until(lambda: len(first.batches) == 1 and len(second.batches) == 1)
    stopping = asyncio.ensure_future(batcher.stop())
    await settle()
    assert all(f.done() and isinstance(f.exception(), Unavailable) for f in in_flight)
    first.gate.set()
    second.gate.set()
    await result(stopping)
    assert not batcher.running


# The wide runner: every core for a request that arrives alone, the instances for load.


async def test_a_lone_request_runs_on_the_wide_runner_and_load_on_the_instances() -> None:
    first, second, wide = FakeModel(), FakeModel(), FakeModel()
    async with running([first, second], ManualClock(), wide=wide) as batcher:
        assert batcher.instances == 2  # the wide runner is not an instance
        assert ids([await result(batcher.submit(item(0)))]) == [0]  # alone, every instance idle: wide
        wide.gate.clear()
        lone = asyncio.ensure_future(batcher.submit(item(1)))
        await until(lambda: len(wide.batches) == 2)
        together = [asyncio.ensure_future(batcher.submit(item(i))) for i in (2, 3)]
        await settle()
        assert first.batches == [] and second.batches == [] and batcher.queued == 2  # the wide one has the cores
        wide.gate.set()
        assert ids([await result(lone)]) == [1]
        assert ids(await result(asyncio.gather(*together))) == [2, 3]
        assert first.batches == [[2, 3]]  # two waiting: a batch for an instance, never the wide runner
        first.gate.clear()
        held = [asyncio.ensure_future(batcher.submit(item(i))) for i in (4, 5)]
        await until(lambda: len(first.batches) == 2)
        alone_beside_load = await result(batcher.submit(item(6)))  # alone, but an instance is busy
        assert second.batches == [[6]] and ids([alone_beside_load]) == [6]
        first.gate.set()
        assert ids(await result(asyncio.gather(*held))) == [4, 5]
        assert wide.batches == [[0], [1]] and batcher.wide_batches == 2


async def test_a_lone_input_with_others_still_being_decoded_takes_an_instance() -> None:
    first, second, wide = FakeModel(), FakeModel(), FakeModel()
    async with running([first, second], ManualClock(), wide=wide) as batcher:
        with batcher.arriving(1):  # another request's image is still being decoded as this one is queued
            assert ids([await result(batcher.submit(item(0)))]) == [0]
        assert first.batches == [[0]] and wide.batches == []  # under load: not alone, whatever the queue says
        assert ids([await result(batcher.submit(item(1)))]) == [1]  # nothing on its way any more
        assert wide.batches == [[1]]


async def test_without_a_wide_runner_a_lone_request_takes_the_first_instance() -> None:
    first, second = FakeModel(), FakeModel()
    async with running([first, second], ManualClock()) as batcher:
        await result(batcher.submit(item(0)))
        assert first.batches == [[0]] and second.batches == [] and batcher.wide_batches == 0


def test_a_batcher_needs_a_runner() -> None:
    with pytest.raises(ValueError, match="at least one runner"):
        Batcher([], BatchingConfig(1, 0.0, 1))
