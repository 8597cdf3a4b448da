"""The batcher's bounded queue (service/batching/queue.py): a full queue refuses at once, and a
cancelled request frees its place at once.

Driven through the batcher with the manual clock and fake model of fakes.py."""

from __future__ import annotations

import asyncio

import pytest

from service.core.errors import Unavailable
from tests.service.batching.fakes import (
    FakeModel,
    ManualClock,
    busy_runner,
    ids,
    item,
    queue_depth,
    result,
    running,
    settle,
)

pytestmark = pytest.mark.anyio


async def test_a_full_queue_is_refused_at_once_with_503_and_retry_after() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, queue_size=2) as batcher:
        async with busy_runner(batcher, model) as plug:
            queued = [asyncio.ensure_future(batcher.submit(item(i))) for i in (1, 2)]
            await settle()
            with pytest.raises(Unavailable) as caught:
                await batcher.submit(item(3))
            assert batcher.queued == 2
            clock.advance(0.5)
        results = await result(asyncio.gather(plug, *queued))
        assert ids(results) == [99, 1, 2]
        assert ids([await result(batcher.submit(item(4)))]) == [4]  # room again once the queue drained
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
    assert "queue is full (2 waiting)" in caught.value.detail
    assert model.batches == [[99], [1, 2], [4]]


async def test_a_cancelled_request_never_reaches_the_runner_and_frees_its_place_at_once() -> None:
    model, clock = FakeModel(), ManualClock()
    async with running(model, clock, queue_size=2) as batcher:
        async with busy_runner(batcher, model) as plug:
            gone = asyncio.ensure_future(batcher.submit(item(1)))
            stays = asyncio.ensure_future(batcher.submit(item(2)))
            await settle()
            gone.cancel()  # what the route does when the client disconnects
            await settle()
            assert batcher.queued == 1 and queue_depth(batcher) == 1
            newcomer = asyncio.ensure_future(batcher.submit(item(3)))  # fits in the place given back
            await settle()
            clock.advance(0.5)
        results = await result(asyncio.gather(plug, stays, newcomer))
        assert batcher.queued == 0 and queue_depth(batcher) == 0
    assert gone.cancelled()
    assert ids(results) == [99, 2, 3]
    assert model.batches == [[99], [2, 3]]
