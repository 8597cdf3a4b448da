"""A request's only image run in its decode thread, on a runner the idle batcher lent it (issue 14, item 4).

What the decode thread does after decoding, and what the loop does while it waits, when the
batcher granted a :class:`~service.batching.alone.Claim` (:meth:`Batcher.claim_alone
<service.batching.batcher.Batcher.claim_alone>`): :func:`service.pipeline.decoding.decode_alone`
calls these. The padding bucket is chosen here for both paths (:func:`bucket_of`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from service.batching.alone import Claim
from service.batching.config import InferenceResult
from service.core import metrics
from service.core.errors import DeadlineExceeded, PayloadTooLarge, ProblemError
from service.runtime.repository import ModelVersion

T = TypeVar("T")


def bucket_of(model: ModelVersion, x: np.ndarray) -> tuple[tuple[int, int] | None, float]:
    """The padding bucket (H, W) of the (C, H, W) input ``x`` (None: none) and its padded fraction, observed.

    Raises:
        PayloadTooLarge: it fits none of the model's buckets (the manifest's checks make it unreachable).
    """
    try:
        bucket = model.preprocessor.spec.bucket_for(x.shape[1], x.shape[2])
    except ValueError as exc:  # a 413, never a 500
        raise PayloadTooLarge(f"the image's model input fits none of the model's padding buckets ({exc})") from None
    if bucket is None:
        return None, 0.0
    padding = 1.0 - x.shape[1] * x.shape[2] / (bucket[0] * bucket[1])
    metrics.PADDING_FRACTION.labels(model.name, str(model.version)).observe(padding)
    return bucket, padding


@dataclass(frozen=True)
class Ran:
    """What an image's run on its claimed runner gave.

    Attributes:
        decode_seconds: from the request's hand-off to the pool to the end of its preprocessing.
        result: its row of the outputs, or the problem that stopped its run (504, 503, 500, 413).
        padding: its bucket's padded fraction (0: none).
    """

    decode_seconds: float
    result: InferenceResult | ProblemError
    padding: float = 0.0


def runs(model: ModelVersion, claim: Claim, deadline: float, started: float) -> Callable[[np.ndarray], Ran]:
    """What the decode thread calls on the decoded (C, H, W) float32 input: run it on ``claim``'s runner.

    Args:
        deadline: the request's, on the batcher's clock.
        started: ``time.perf_counter()`` when the loop handed the image to the pool.
    """

    def run(x: np.ndarray) -> Ran:
        decode_seconds = time.perf_counter() - started
        try:
            bucket, padding = bucket_of(model, x)
            return Ran(decode_seconds, claim.run(x, bucket, deadline), padding)
        except ProblemError as exc:  # an error of its run: the image's outcome
            return Ran(decode_seconds, exc)

    return run


async def until_ran(claim: Claim | None, future: asyncio.Future[Any], waiting: Awaitable[T]) -> T:
    """Await ``waiting`` (the trip's ``future``, until the deadline); with a claim whose run started, to its end.

    A request that stops waiting before its run started (its deadline passed while the image was
    decoded: the 504 of ``waiting``; or it was cancelled) abandons the run (:meth:`Claim.abandon`);
    one whose run has started waits for it, as a batch that started finishes.
    """
    if claim is None:
        return await waiting
    try:
        return await waiting
    except DeadlineExceeded:
        if claim.abandon():
            raise
        return cast(T, await asyncio.shield(future))
    except asyncio.CancelledError:
        claim.abandon()
        raise
