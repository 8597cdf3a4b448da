"""The request path after the body is read: decode -> preprocess -> batch -> run -> post-process.

Each image of a request goes through the steps on its own, so one bad image fails only itself;
a request's images are submitted to the batcher together and may share a batch with other
requests' images.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from service.batching import alone
from service.core import metrics
from service.core.errors import PayloadTooLarge, ProblemError
from service.imaging.pixel_budget import PixelBudget
from service.pipeline.decoding import (
    DecodeLimits,
    ImageOutcome,
    Work,
    decode_alone,
    decode_one,
    probe_one,
    within_request_budget,
)
from service.pipeline.pool import DecodePool
from service.runtime.repository import ModelVersion

__all__ = ["DecodeLimits", "ImageOutcome", "infer_images", "observe_padding", "response_body"]


def observe_padding(model: ModelVersion, height: int, width: int, bucket: tuple[int, int] | None) -> float:
    """The fraction of ``bucket``'s pixels that ``height`` x ``width`` real pixels leave as padding.

    Observed in ``patchserve_padding_fraction`` for ``model`` (``/v1`` images and ``/v2`` rows
    alike); 0.0, not observed, without a bucket (a model without padding buckets).
    """
    if bucket is None:
        return 0.0
    padding = 1.0 - height * width / (bucket[0] * bucket[1])
    metrics.PADDING_FRACTION.labels(model.name, str(model.version)).observe(padding)
    return padding


async def _submit(
    model: ModelVersion, outcome: ImageOutcome, x: np.ndarray | None, deadline: float | None
) -> ImageOutcome:
    if x is None:  # decoding failed: the outcome already holds its problem
        return outcome
    try:
        try:
            bucket = model.preprocessor.spec.bucket_for(x.shape[1], x.shape[2])
        except ValueError as exc:  # the manifest's checks make this unreachable; a 413, never a 500
            raise PayloadTooLarge(f"the image's model input fits none of the model's padding buckets ({exc})") from None
        padding = observe_padding(model, x.shape[1], x.shape[2], bucket)
        result = await model.batcher.submit(x, deadline=deadline, bucket=bucket, whole=True)  # admitted just before
    except ProblemError as exc:
        return dataclasses.replace(outcome, error=exc)
    return dataclasses.replace(outcome, result=result, padding=padding)


async def infer_images(
    model: ModelVersion,
    payloads: list[bytes],
    *,
    pool: Executor,
    max_pixels: int,
    deadline: float | None = None,
    decode_parallelism: int = 1,
    limits: DecodeLimits | None = None,
    budget: PixelBudget | None = None,
    keep_images: bool = False,
) -> list[ImageOutcome]:
    """Decode, preprocess and run every image of one request.

    A request is admitted whole or not at all: unless the batcher's queue has room for all its
    images it is refused before any is decoded, and again after decoding, before any is queued
    (an overloaded server answers 503, not a 200 full of per-image 503s). Its images are
    decoded at most ``decode_parallelism`` at a time, so one request of many large images
    cannot hold the whole decode pool while other requests wait.

    Memory and CPU are bounded in pixels (issue 15 F): each file's header (and the JPEG and PNG
    pre-scan) is read first; in request order, an image that would take the request past
    ``limits.max_request_pixels`` decoded pixels is a 413 entry; each other image holds its
    decoded pixels of the worker's ``budget`` while it is decoded and preprocessed, waiting for
    room until the deadline (504) when the worker is decoding as much as the budget allows.
    Unless ``keep_images`` (``render=png`` draws on the picture, kept at most 2048x2048 pixels'
    worth: :meth:`DecodedImage.for_picture`), the picture is dropped as soon as it is
    preprocessed: an outcome keeps its sizes, not its pixels.

    Args:
        model: the model version to run.
        payloads: the image files' bytes, in request order.
        pool: the decode thread pool.
        max_pixels: the decoded-size limit (413 above it).
        deadline: when the request expires, on the batcher's clock (``model.batcher.deadline()``);
            an image still waiting for decoding room, decoding or queued then gets a 504 (a
            decode thread runs on, its pixels reserved until it ends). None: the model's
            ``request_timeout``, from now for decoding and from when each image is queued.
        decode_parallelism: most of this request's images decoding at once (>= 1).
        limits: the pre-scan's and the request's pixel limits (default :class:`DecodeLimits`).
        budget: the worker's decoded-pixel budget (None: no budget).
        keep_images: keep each outcome's picture (``image.image``, RGB, for ``render=png``); else it is None.

    Returns:
        One outcome per payload, in request order; an image's own errors are in its outcome.

    Raises:
        BadRequest, Unavailable: from :meth:`~service.batching.batcher.Batcher.admit`: more images than
            the whole queue holds (400), or no room for all of them now (503, Retry-After).
    """
    model.batcher.admit(len(payloads))
    limits = limits or DecodeLimits()
    slots = asyncio.Semaphore(decode_parallelism)
    works = [Work(i, data) for i, data in enumerate(payloads)]
    decode_deadline = deadline if deadline is not None else model.batcher.deadline()
    cheap = len(works) == 1 and len(payloads[0]) <= alone.MAX_BYTES and isinstance(pool, DecodePool) and pool.idle
    with model.batcher.arriving(len(payloads)):  # on their way: no lone input ahead of them takes the wide runner
        # The only image of a request that finds the batcher and a decode thread idle claims its runner:
        # decoded and run in one trip (service/batching/alone.py).
        lone = model.batcher.claim_alone() if cheap else None
        if len(works) == 1:  # the common case: one trip to the pool
            decoded = [
                await decode_alone(
                    model, works[0], pool, max_pixels, limits, budget=budget, deadline=decode_deadline,
                    keep_image=keep_images, lone=lone,
                )
            ]  # fmt: skip
        else:
            await asyncio.gather(
                *(probe_one(model, work, pool, max_pixels, limits, slots, decode_deadline) for work in works)
            )
            within_request_budget(works, limits.max_request_pixels)
            decoded = await asyncio.gather(
                *(
                    decode_one(model, work, pool, max_pixels, slots, budget=budget, deadline=decode_deadline,
                            keep_image=keep_images)
                    for work in works
                )
            )  # fmt: skip
    model.batcher.admit(sum(x is not None and outcome.result is None for outcome, x in decoded))
    if len(decoded) == 1:
        outcome, x = decoded[0]
        if outcome.result is not None and x is not None:  # run already, as a lone request
            bucket = model.preprocessor.spec.bucket_for(x.shape[1], x.shape[2])
            return [dataclasses.replace(outcome, padding=observe_padding(model, x.shape[1], x.shape[2], bucket))]
        return [await _submit(model, outcome, x, deadline)]
    return list(await asyncio.gather(*(_submit(model, outcome, x, deadline) for outcome, x in decoded)))


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
