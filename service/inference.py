"""The request path after the body is read: decode -> preprocess -> batch -> run -> post-process.

Each image of a request goes through the steps on its own, so one bad image fails only itself;
a request's images are submitted to the batcher together and may share a batch with other
requests' images.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import metrics
from service.batching import InferenceResult
from service.errors import ProblemError
from service.images import DecodedImage, decode_image
from service.preprocess import Preprocessor
from service.repository import ModelVersion


@dataclass(frozen=True)
class ImageOutcome:
    """What happened to one image of a request: its result, or the problem that stopped it.

    Attributes:
        index: position in the request (0-based).
        image: the decoded image (None if decoding failed).
        result: the model's outputs for this image (None on error).
        error: the problem to report for this image (None on success).
        decode_seconds: time spent decoding and preprocessing, in seconds.
    """

    index: int
    image: DecodedImage | None
    result: InferenceResult | None
    error: ProblemError | None
    decode_seconds: float


def _decode_and_preprocess(model: ModelVersion, data: bytes, max_pixels: int) -> tuple[DecodedImage, np.ndarray]:
    """Blocking: runs in the decode thread pool. Returns the image and its (C, H, W) input."""
    return decode_and_preprocess(model.preprocessor, data, max_pixels)


def decode_and_preprocess(preprocessor: Preprocessor, data: bytes, max_pixels: int) -> tuple[DecodedImage, np.ndarray]:
    """An image file as the server reads it: decoded (JPEG draft, EXIF, background) and preprocessed.

    Returns:
        The decoded image and its float32 (C, H, W) model input.

    Raises:
        InvalidImage, PayloadTooLarge: as :func:`service.images.decode_image`.
    """
    decoded = decode_image(
        data,
        color_mode=preprocessor.spec.color_mode,
        max_pixels=max_pixels,
        draft_size=preprocessor.draft_size,
        background=preprocessor.spec.background,
    )
    return decoded, preprocessor(decoded.image)


async def _decode(
    model: ModelVersion, index: int, data: bytes, pool: Executor, max_pixels: int, limit: asyncio.Semaphore
) -> tuple[ImageOutcome, np.ndarray | None]:
    """Decode and preprocess one image in the pool; its outcome so far and its (C, H, W) input."""
    async with limit:
        started = time.perf_counter()
        try:
            decoded, x = await asyncio.get_running_loop().run_in_executor(
                pool, _decode_and_preprocess, model, data, max_pixels
            )
        except ProblemError as exc:
            return ImageOutcome(index, None, None, exc, time.perf_counter() - started), None
    decode_seconds = time.perf_counter() - started
    metrics.DECODE_DURATION.labels(model.name, str(model.version)).observe(decode_seconds)
    return ImageOutcome(index, decoded, None, None, decode_seconds), x


async def _submit(
    model: ModelVersion, outcome: ImageOutcome, x: np.ndarray | None, deadline: float | None
) -> ImageOutcome:
    if x is None:  # decoding failed: the outcome already holds its problem
        return outcome
    try:
        result = await model.batcher.submit(x, deadline=deadline)
    except ProblemError as exc:
        return dataclasses.replace(outcome, error=exc)
    return dataclasses.replace(outcome, result=result)


async def infer_images(
    model: ModelVersion,
    payloads: list[bytes],
    *,
    pool: Executor,
    max_pixels: int,
    deadline: float | None = None,
    decode_parallelism: int = 1,
) -> list[ImageOutcome]:
    """Decode, preprocess and run every image of one request.

    A request is admitted whole or not at all: unless the batcher's queue has room for all its
    images it is refused before any is decoded, and again after decoding, before any is queued
    (an overloaded server answers 503, not a 200 full of per-image 503s). Its images are
    decoded at most ``decode_parallelism`` at a time, so one request of many large images
    cannot hold the whole decode pool while other requests wait.

    Args:
        model: the model version to run.
        payloads: the image files' bytes, in request order.
        pool: the decode thread pool.
        max_pixels: the decoded-size limit (413 above it).
        deadline: when the request expires, on the batcher's clock (``model.batcher.deadline()``);
            an image still queued then gets a 504. None: the model's ``request_timeout`` from
            when each image is queued.
        decode_parallelism: most of this request's images decoding at once (>= 1).

    Returns:
        One outcome per payload, in request order; an image's own errors are in its outcome.

    Raises:
        BadRequest, Unavailable: from :meth:`~service.batching.Batcher.admit`: more images than
            the whole queue holds (400), or no room for all of them now (503, Retry-After).
    """
    model.batcher.admit(len(payloads))
    limit = asyncio.Semaphore(decode_parallelism)
    decoded = await asyncio.gather(
        *(_decode(model, i, data, pool, max_pixels, limit) for i, data in enumerate(payloads))
    )
    model.batcher.admit(sum(x is not None for _, x in decoded))
    return list(await asyncio.gather(*(_submit(model, outcome, x, deadline) for outcome, x in decoded)))


def timings(outcomes: list[ImageOutcome]) -> dict[str, float]:
    """Decode, queue and compute seconds of a request, for ``Server-Timing``.

    With several images each figure is the largest among them (what the client waited for).
    """
    return {
        "decode": max(o.decode_seconds for o in outcomes),
        "queue": max((o.result.queue_seconds for o in outcomes if o.result), default=0.0),
        "compute": max((o.result.compute_seconds for o in outcomes if o.result), default=0.0),
    }


def response_body(
    model: ModelVersion,
    outcomes: list[ImageOutcome],
    render: Callable[[ImageOutcome], dict[str, Any]],
    *,
    instance: str | None,
) -> dict[str, Any]:
    """The JSON body: one image's response, or ``{"results": [...]}`` for several.

    Args:
        render: builds the task's fields of one successful outcome
            (:meth:`service.tasks.Task.fields`).

    Raises:
        ProblemError: a single-image request whose image failed (its own status code).
    """

    def one(outcome: ImageOutcome) -> dict[str, Any]:
        if outcome.error is not None:
            return outcome.error.to_problem(instance)
        assert outcome.image is not None and outcome.result is not None
        return {
            "model": model.name,
            "version": str(model.version),
            "image": {"width": outcome.image.width, "height": outcome.image.height},
            **render(outcome),
        }

    if len(outcomes) == 1:
        if outcomes[0].error is not None:
            raise outcomes[0].error
        return one(outcomes[0])
    return {"results": [one(o) for o in outcomes]}
