"""/readyz with several workers: ready only once every live worker has loaded its models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from service.runtime.worker_readiness import PREFIX, WorkerReadiness


def test_ready_only_when_every_live_worker_has_marked_itself(tmp_path: Path) -> None:
    this = WorkerReadiness(tmp_path, workers=2)
    assert this.ready_workers() == 0 and this.not_ready_reason() == "0 of 2 worker processes have loaded their models"
    this.set_ready()
    assert this.not_ready_reason() == "1 of 2 worker processes have loaded their models"
    # another live worker (the test's parent process stands in for it)
    (tmp_path / f"{PREFIX}{os.getppid()}").touch()
    assert this.ready_workers() == 2 and this.not_ready_reason() == ""
    # a worker that died leaves its mark behind: a dead pid does not count
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"{PREFIX}{int(dead.stdout)}").touch()
    (tmp_path / f"{PREFIX}not-a-pid").touch()
    assert this.ready_workers() == 2
    this.clear()
    assert this.ready_workers() == 1 and not (tmp_path / f"{PREFIX}{os.getpid()}").exists()
    this.clear()  # twice is harmless


def test_the_server_state_adds_the_other_workers_reason_once_its_own_models_are_ready(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from service.core.settings import Settings
    from service.http.state import ServerState

    class Ready:
        name, version, ready, not_ready_reason = "m", 1, True, ""

    class Repository:
        def all(self) -> list:
            return [Ready()]

    pools = ThreadPoolExecutor(1), ThreadPoolExecutor(1)  # decode, render
    state = ServerState(Settings(), *pools, workers=WorkerReadiness(tmp_path, workers=2))
    assert state.not_ready_reasons() == ["models are still loading"]
    state.repository = Repository()  # type: ignore[assignment]
    state.workers.set_ready()
    assert state.not_ready_reasons() == ["1 of 2 worker processes have loaded their models"]
    (tmp_path / f"{PREFIX}{os.getppid()}").touch()
    assert state.not_ready_reasons() == []
    state.decode_pool.shutdown()
