"""Polling the model repository (``PATCHSERVE_REPOSITORY_POLL_SECONDS``): Triton's ``poll`` model control mode.

Every ``seconds`` each worker process scans the repository folder and brings what it serves in
line with it (:meth:`service.runtime.model_control.ModelControl.sync`): a version folder published since
the last scan is loaded once its files have stayed unchanged for one interval, a version the
version policy no longer selects (or whose folder was removed) is retired, a version whose files
changed is loaded again and swapped in. Each worker polls on its own, so with several workers
they converge within one interval plus the time one load takes (docs/model-control.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from service.core.lifecycle import shutdown_requested

log = logging.getLogger(__name__)


async def poll_forever(state: Any, loading: asyncio.Task[None], seconds: float) -> None:
    """Scan every ``seconds`` once start-up (``loading``) has loaded the models, until cancelled or draining.

    Draining starts at the signal (:func:`~service.core.lifecycle.shutdown_requested`), not when the
    drain delay has passed: a fresh user's server went on loading and warming up a replaced
    repository for the 5 s between them.

    Args:
        state: the worker's :class:`~service.http.state.ServerState` (its ``control`` and ``draining``).
        loading: the start-up task; nothing is polled if it failed to load the models.
        seconds: the interval.
    """
    await asyncio.shield(loading)
    if state.repository is None:
        return
    log.info("polling the model repository %s every %g s", state.control.root, seconds)
    while not (state.draining or shutdown_requested()):
        await asyncio.sleep(seconds)
        if state.draining or shutdown_requested():
            return
        try:
            await state.control.sync()
        except Exception:  # a scan that failed (a folder vanished mid-scan): the next one tries again
            log.exception("polling the model repository failed; serving is unchanged")
