"""An idle worker gives its freed memory back (glibc's malloc_trim), never while it holds a request."""

from __future__ import annotations

import asyncio

import pytest

from service.core.memory import IdleTrim, malloc_trim
from tests.conftest import running_app

pytestmark = pytest.mark.anyio


def test_malloc_trim_is_found_in_this_glibc_and_runs() -> None:
    trim = malloc_trim()
    assert trim is not None  # this Debian's glibc has it; musl and macOS would give None
    assert trim() in (0, 1)


async def test_a_trim_comes_once_the_worker_has_been_idle_and_only_after_it_served() -> None:
    calls: list[int] = []
    trimmer = IdleTrim(lambda: calls.append(1) or 1, idle_seconds=0.01)
    trimmer.idle()  # nothing served yet: nothing to give back
    assert trimmer._pending is None
    trimmer.busy()
    trimmer.idle()
    trimmer.busy()  # a request came within the idle time: no trim while it runs
    assert trimmer._pending is None and trimmer.last is None
    trimmer.idle()
    await asyncio.wait_for(until_started(trimmer), 10)
    await trimmer.last
    assert calls == [1] and trimmer.trims == 1
    trimmer.idle()  # idle again, nothing served since: no second trim
    assert trimmer._pending is None


async def until_started(trimmer: IdleTrim) -> None:
    while trimmer.last is None:
        await asyncio.sleep(0.01)


async def test_the_server_trims_after_its_requests_end_and_not_for_probes() -> None:
    async with running_app() as client:
        trimmer = client.app.state.server.idle_trim
        assert trimmer is not None
        trimmer.idle_seconds = 0.01
        before = trimmer.trims
        for _ in range(3):
            assert (await client.get("/healthz")).status_code == 200  # exempt from admission: not served work
        await asyncio.sleep(0.05)
        assert trimmer.last is None and trimmer._pending is None
        assert (await client.get("/v1/models")).status_code == 200
        await asyncio.wait_for(until_started(trimmer), 10)
        await trimmer.last
        assert trimmer.trims == before + 1
