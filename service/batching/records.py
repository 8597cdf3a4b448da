"""What every batch leaves behind, whichever path ran it: its metrics, its log line, its failure's detail.

The batcher's loop (:mod:`service.batching.batcher`) and the idle fast path
(:mod:`service.batching.alone`) record a batch the same way through :class:`BatchRecords`, so
``patchserve_batches_total``, ``patchserve_batch_size``, ``patchserve_queue_duration_seconds`` and
``patchserve_compute_duration_seconds`` count every batch once, whoever ran it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from service.batching.arrays import BatchOutputMismatch
from service.core import metrics

log = logging.getLogger("service.batching.batcher")  # the release line keeps the logger docs/batching.md shows


class BatchRecords:
    """The batch metrics of one model version (``labels``; ``name``: ``model/version``), label lookups done once.

    prometheus_client's metrics are thread-safe: a decode thread may record as well as the loop.
    """

    def __init__(self, model: str, version: str) -> None:
        self.labels = (model, version)
        self.name = f"{model}/{version}"
        self._queue_duration = metrics.QUEUE_DURATION.labels(model, version)
        self._compute_duration = metrics.COMPUTE_DURATION.labels(model, version)
        self._batch_size = metrics.BATCH_SIZE.labels(model, version)
        self._released = {reason: metrics.BATCHES.labels(model, version, reason) for reason in metrics.RELEASE_REASONS}

    def released(self, reason: str, size: int, waited: float, still_queued: int) -> None:
        """A batch of ``size`` inputs left the queue for ``reason`` (size, delay or idle).

        Args:
            waited: seconds its oldest input waited in the queue (the debug line only).
            still_queued: inputs left in the queue behind it (the debug line only).
        """
        self._released[reason].inc()
        self._batch_size.observe(size)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "model %s: batch of %d released (%s); its oldest request waited %.3f ms, %d still queued",
                self.name, size, reason, waited * 1e3, still_queued,
            )  # fmt: skip

    def ran(self, compute: float, queued_for: Iterable[float]) -> None:
        """A batch ran for ``compute`` seconds; ``queued_for``: each of its inputs' seconds in the queue."""
        self._compute_duration.observe(compute)
        for seconds in queued_for:
            self._queue_duration.observe(seconds)


def failure_detail(name: str, size: int, exc: Exception) -> str:
    """The 500's detail of a batch of ``size`` inputs of model version ``name`` whose run raised ``exc``."""
    if isinstance(exc, BatchOutputMismatch):
        return f"model {name} returned outputs that do not match its batch of {size}: {exc}"
    return f"model {name}: the run failed for this batch of {size}: {type(exc).__name__}: {exc}"
