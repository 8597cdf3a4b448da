"""service.runtime.repository_watch: the poller stops at the shutdown signal, not at the end of the drain."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.core import lifecycle
from service.runtime.repository_watch import poll_forever

pytestmark = pytest.mark.anyio


async def test_the_poller_stops_scanning_once_shutdown_is_requested() -> None:
    # Found by a fresh user: during the drain delay after SIGTERM the poller loaded and warmed up a
    # replaced repository, since it waited for the drain's end (state.draining), not for the signal.
    scans = []

    async def sync() -> None:
        scans.append(1)

    state = SimpleNamespace(draining=False, repository=object(), control=SimpleNamespace(sync=sync, root=Path(".")))
    loaded = asyncio.get_running_loop().create_future()
    loaded.set_result(None)
    poller = asyncio.ensure_future(poll_forever(state, loaded, 0.01))  # type: ignore[arg-type]
    try:
        for _ in range(1000):  # a bound on waiting, not a measured time
            if len(scans) >= 2:
                break
            await asyncio.sleep(0.01)
        lifecycle.request_shutdown()
        await asyncio.wait_for(poller, 10)  # it returns by itself
        assert state.draining is False and len(scans) >= 2
        after = len(scans)
        await asyncio.sleep(0.05)  # five intervals
        assert len(scans) == after
    finally:
        lifecycle.clear_shutdown()
        poller.cancel()
