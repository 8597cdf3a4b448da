"""Readiness across worker processes: ``/readyz`` is 200 only once every worker has loaded its models.

With ``PATCHSERVE_WORKERS`` > 1 the workers share one listening socket and the kernel hands
each new connection to any of them. A worker that had not finished loading answered its
requests 503 ("the models are still loading") while ``/readyz``, answered by a worker that had,
said 200: a load balancer or Kubernetes probe sent traffic that then failed. So each worker,
once its models are loaded and warmed up, writes ``ready-<pid>`` into the folder the workers
share (``PROMETHEUS_MULTIPROC_DIR``, created and wiped at every start by :mod:`service.process.serve`),
and removes it when it stops; a worker counts the marks of live processes, and is ready only
when they are as many as the workers configured. A worker that dies leaves a mark of a dead
pid, which does not count, so while uvicorn's supervisor replaces it (and until the new one
has loaded) every worker says not ready.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PREFIX = "ready-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class WorkerReadiness:
    """This worker's ready mark in ``folder``, and the count of every live worker's.

    Args:
        folder: the workers' shared folder.
        workers: how many worker processes the server runs.
    """

    def __init__(self, folder: Path, workers: int) -> None:
        self.folder, self.workers = folder, workers
        self.mark = folder / f"{PREFIX}{os.getpid()}"

    def set_ready(self) -> None:
        """Mark this worker ready (its models loaded and warmed up)."""
        self.mark.touch()

    def clear(self) -> None:
        """Remove this worker's mark (it stops, or drains)."""
        with contextlib.suppress(FileNotFoundError):
            self.mark.unlink()

    def ready_workers(self) -> int:
        """Live workers that have marked themselves ready."""
        count = 0
        for path in self.folder.glob(f"{PREFIX}*"):
            pid = path.name[len(PREFIX) :]
            if pid.isdigit() and _alive(int(pid)):
                count += 1
        return count

    def not_ready_reason(self) -> str:
        """Why the server as a whole is not ready yet ("" once every worker is)."""
        ready = self.ready_workers()
        if ready >= self.workers:
            return ""
        return f"{ready} of {self.workers} worker processes have loaded their models"
