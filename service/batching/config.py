"""The batcher's contract: its knobs (:class:`BatchingConfig`) and one input's answer (:class:`InferenceResult`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

# (B, C, H, W) [, int64 (B, H, W) pixel mask for bucketed inputs] -> {output name: (B, ...)}
RunFn = Callable[..., Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class BatchingConfig:
    """Batching knobs for one model version (Triton's dynamic-batcher names, in seconds).

    Attributes:
        max_batch_size: most inputs in one model run.
        max_queue_delay: seconds the oldest queued input may wait for its batch to fill.
        queue_size: most inputs waiting; one more is refused with 503 and ``Retry-After``. A
            request's inputs admitted together are all queued, which may pass it for a moment.
        request_timeout: seconds from a request's arrival to its deadline; a request may ask
            for less, never more. Still queued at its deadline: 504, never computed.

    Raises:
        ValueError: a value out of range (``max_batch_size`` or ``queue_size`` < 1,
            ``max_queue_delay`` < 0, ``request_timeout`` <= 0).
    """

    max_batch_size: int
    max_queue_delay: float
    queue_size: int
    request_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.queue_size < 1:
            raise ValueError(f"max_batch_size and queue_size must be >= 1 (got {self})")
        if self.max_queue_delay < 0 or self.request_timeout <= 0:
            raise ValueError(f"max_queue_delay must be >= 0 and request_timeout > 0 (got {self})")

    def override(
        self,
        *,
        max_batch_size: int | None = None,
        max_queue_delay: float | None = None,
        queue_size: int | None = None,
        request_timeout: float | None = None,
    ) -> BatchingConfig:
        """A copy with every value that is not None replaced (a manifest's ``batching`` section)."""
        return BatchingConfig(
            max_batch_size=self.max_batch_size if max_batch_size is None else max_batch_size,
            max_queue_delay=self.max_queue_delay if max_queue_delay is None else max_queue_delay,
            queue_size=self.queue_size if queue_size is None else queue_size,
            request_timeout=self.request_timeout if request_timeout is None else request_timeout,
        )


@dataclass(frozen=True)
class InferenceResult:
    """One input's share of a batch run.

    Attributes:
        outputs: each graph output's row for this input, batch axis removed.
        queue_seconds: from ``submit`` to the start of the run.
        compute_seconds: the whole batch's run time.
        batch_size: how many inputs shared the run.
    """

    outputs: dict[str, np.ndarray]
    queue_seconds: float
    compute_seconds: float
    batch_size: int
