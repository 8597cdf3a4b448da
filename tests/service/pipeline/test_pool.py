"""The decode pool's jobs: one still queued when nobody waits for it any more is dropped, never run.

Found by a fresh user: 20 clients that uploaded a slow image and hung up at once left their
decodes queued in the pool, which ran them all for nobody; the next request waited 28 s.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.core.errors import DeadlineExceeded
from service.pipeline import decoding
from service.pipeline.pool import DecodePool, in_pool, until
from tests.conftest import running_app
from tests.service.pipeline.recorded_runner import CLASSIFY, HANG_GUARD, one_of_each
from tests.service.pipeline.recorded_runner import until as eventually

pytestmark = pytest.mark.anyio


async def test_a_queued_job_is_dropped_at_its_deadline_or_when_its_waiter_is_cancelled() -> None:
    gate, ran = threading.Event(), []
    loop = asyncio.get_running_loop()
    with DecodePool(1) as pool:
        busy = pool.submit(gate.wait, HANG_GUARD)  # the one thread is taken: what follows is queued
        late, late_job = in_pool(pool, ran.append, "late")
        with pytest.raises(DeadlineExceeded, match="being decoded"):
            await until(loop.time() + 0.01, loop.time, late, "this image was being decoded", late_job)
        gone, gone_job = in_pool(pool, ran.append, "gone")
        waiter = asyncio.ensure_future(
            until(loop.time() + HANG_GUARD, loop.time, gone, "this image was being decoded", gone_job)
        )
        await asyncio.sleep(0)
        waiter.cancel()  # its client left
        with pytest.raises(asyncio.CancelledError):
            await waiter
        kept, kept_job = in_pool(pool, ran.append, "kept")
        gate.set()
        assert busy.result(HANG_GUARD)
        await until(loop.time() + HANG_GUARD, loop.time, kept, "this image was being decoded", kept_job)
        await eventually(lambda: late.cancelled() and gone.cancelled() and pool.pending == 0)
    assert ran == ["kept"]  # the two nobody waited for never ran


async def test_requests_that_left_or_timed_out_while_queued_are_never_decoded(digits_test_split, monkeypatch) -> None:
    (digit,) = one_of_each(digits_test_split, range(1))
    headers = {"content-type": "image/png"}
    decoded: list[object] = []
    original = decoding._open_and_decode

    def recorded(*args, **kwargs):
        decoded.append(args)
        return original(*args, **kwargs)

    gate = threading.Event()
    async with running_app(decode_threads=1) as client:
        pool = client.app.state.server.decode_pool
        monkeypatch.setattr(decoding, "_open_and_decode", recorded)
        busy = pool.submit(gate.wait, HANG_GUARD)  # another request's slow image holds the one thread
        timed_out = await client.post(CLASSIFY + "?timeout=0.2", content=digit, headers=headers)
        leaving = asyncio.ensure_future(client.post(CLASSIFY, content=digit, headers=headers))
        await eventually(lambda: pool.pending == 2)  # its decode is queued behind the busy one
        leaving.cancel()  # the client hangs up
        with pytest.raises(asyncio.CancelledError):
            await leaving
        await eventually(lambda: pool.pending == 1)  # its queued decode dropped as the cancellation reached it
        gate.set()
        assert busy.result(HANG_GUARD)
        await eventually(lambda: pool.pending == 0)
        assert timed_out.status_code == 504 and decoded == []  # neither was decoded for nobody
        after = await client.post(CLASSIFY, content=digit, headers=headers)
    assert after.status_code == 200 and len(decoded) == 1
