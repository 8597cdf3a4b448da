"""The request path after the body is read: decode -> preprocess -> batch -> run -> post-process.

Each image of a request goes through the steps on its own, so one bad image fails only itself;
a request's images are submitted to the batcher together and may share a batch with other
requests' images.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.batching.config import InferenceResult
from service.core import metrics, tracing
from service.core.errors import (
    DeadlineExceeded,
    ImageProcessingFailed,
    PayloadTooLarge,
    ProblemError,
)
from service.imaging.images import DecodedImage, OpenedImage, decode_image, open_image
from service.imaging.pixel_budget import PixelBudget
from service.imaging.preprocess import Preprocessor
from service.imaging.prescan import PrescanLimits
from service.runtime.repository import ModelVersion

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageOutcome:
    """What happened to one image of a request: its result, or the problem that stopped it.

    Attributes:
        index: position in the request (0-based).
        image: the decoded image (None if decoding failed).
        result: the model's outputs for this image (None on error).
        error: the problem to report for this image (None on success).
        decode_seconds: time spent decoding and preprocessing, in seconds.
        padding: the fraction of its bucket's pixels that were padding (0: no bucket, or none).
    """

    index: int
    image: DecodedImage | None
    result: InferenceResult | None
    error: ProblemError | None
    decode_seconds: float
    padding: float = 0.0


@dataclass(frozen=True)
class DecodeLimits:
    """What one request's images may cost to decode, beyond each image's own pixel limit.

    Attributes:
        prescan: the JPEG and PNG structure and metadata limits (:mod:`service.imaging.prescan`).
        max_request_pixels: decoded pixels of all the request's images together; an image that
            would take the request past it is a 413 entry of its own.
    """

    prescan: PrescanLimits = field(default_factory=PrescanLimits)
    max_request_pixels: int = 160_000_000


def _probe(model: ModelVersion, data: bytes, max_pixels: int, limits: PrescanLimits) -> OpenedImage:
    """Blocking: runs in the decode thread pool. ``data`` pre-scanned and its header parsed."""
    preprocessor = model.preprocessor
    return open_image(
        data,
        color_mode=preprocessor.spec.color_mode,
        max_pixels=max_pixels,
        draft_size=preprocessor.draft_size,
        limits=limits,
    )


def _decode_and_preprocess(
    model: ModelVersion, opened: OpenedImage, max_pixels: int, keep_image: bool = True
) -> tuple[DecodedImage, np.ndarray]:
    """Blocking: runs in the decode thread pool. Returns the image and its (C, H, W) input."""
    decoded, x = _preprocessed(model.preprocessor, opened.decode(model.preprocessor.spec.background), max_pixels)
    return (decoded if keep_image else decoded.dropped()), x


def decode_and_preprocess(
    preprocessor: Preprocessor, data: bytes, max_pixels: int, *, limits: PrescanLimits | None = None
) -> tuple[DecodedImage, np.ndarray]:
    """An image file as the server reads it: decoded (JPEG draft, EXIF, background) and preprocessed.

    Returns:
        The decoded image and its float32 (C, H, W) model input.

    Raises:
        InvalidImage, PayloadTooLarge: as :func:`service.imaging.images.decode_image`; PayloadTooLarge
            also when the model input would have more than ``max_pixels`` pixels (a
            ``shortest_edge`` policy without ``longest_edge`` turns a 1x4000 strip into 224x896000).
    """
    decoded = decode_image(
        data,
        color_mode=preprocessor.spec.color_mode,
        max_pixels=max_pixels,
        draft_size=preprocessor.draft_size,
        background=preprocessor.spec.background,
        limits=limits,
    )
    return _preprocessed(preprocessor, decoded, max_pixels)


def _preprocessed(
    preprocessor: Preprocessor, decoded: DecodedImage, max_pixels: int
) -> tuple[DecodedImage, np.ndarray]:
    """``decoded`` and its model input; PayloadTooLarge as :func:`decode_and_preprocess`."""
    input_w, input_h = preprocessor.content_size(*decoded.size)
    if input_w * input_h > max_pixels:
        raise PayloadTooLarge(
            f"the model's input for this {decoded.width}x{decoded.height} image would be {input_h}x{input_w} = "
            f"{input_w * input_h} pixels; the limit is {max_pixels}"
        )
    assert decoded.image is not None  # just decoded: only dropped() after this returns
    return decoded, preprocessor(decoded.image)


def _our_fault(model: ModelVersion, index: int, exc: Exception) -> ImageProcessingFailed:
    """The 500 of one image whose decoding raised what no file should make it raise (a bug of ours)."""
    log.error("decoding or preprocessing image %d for %s/%s failed", index, model.name, model.version, exc_info=exc)
    return ImageProcessingFailed(
        f"decoding or preprocessing this image failed on the server's side ({type(exc).__name__}), a "
        "fault of ours, not of the image; the server log has the details"
    )


@dataclass
class _Work:
    """One image on its way through the request: its file, what it decodes to, its outcome so far."""

    index: int
    data: bytes
    pixels: int = 0
    opened: OpenedImage | None = None  # pre-scanned, header parsed: decoded from here, not from data again
    error: ProblemError | None = None
    seconds: float = 0.0


async def _until(deadline: float, clock_now: Callable[[], float], future: asyncio.Future[Any], what: str) -> Any:
    """Await a decode-pool ``future`` until ``deadline`` (on the batcher's clock), then give up on it.

    A Pillow decode running in a thread cannot be interrupted: the pre-scan's and the pixel
    limits bound its work, and the request still answers at its deadline while it runs on.

    Raises:
        DeadlineExceeded: the deadline passed first (504).
    """
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # its fault, if any, is retrieved
    try:
        return await asyncio.wait_for(asyncio.shield(future), max(deadline - clock_now(), 0.0))
    except TimeoutError:
        raise DeadlineExceeded(f"the request's deadline passed while this image was being {what}") from None


async def _probe_one(
    model: ModelVersion,
    work: _Work,
    pool: Executor,
    max_pixels: int,
    limits: DecodeLimits,
    slots: asyncio.Semaphore,
    deadline: float,
) -> None:
    """Read what ``work``'s file decodes to, from its header (pre-scan included), in the pool."""
    async with slots:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(pool, _probe, model, work.data, max_pixels, limits.prescan)
            work.opened = await _until(deadline, model.batcher.clock.now, future, "read")
            work.pixels = work.opened.pixels
        except ProblemError as exc:
            work.error = exc
        except Exception as exc:
            work.error = _our_fault(model, work.index, exc)
        work.seconds += time.perf_counter() - started
    if work.error is not None:
        _trace_failed_decode(work.error)


def _trace_failed_decode(error: ProblemError) -> None:
    """The ``decode`` span of an image refused from its header: failed, as if its decode had failed."""
    with contextlib.suppress(ProblemError), tracing.decoding():
        raise error


def _within_request_budget(works: list[_Work], max_request_pixels: int) -> None:
    """In request order, refuse (413) each image that would take the request past ``max_request_pixels``."""
    total = 0
    for work in works:
        if work.error is not None:
            continue
        if total + work.pixels > max_request_pixels:
            work.error = PayloadTooLarge(
                f"this image decodes to {work.pixels} pixels, which would take this request's images past "
                f"{max_request_pixels} decoded pixels together (PATCHSERVE_MAX_REQUEST_PIXELS); send fewer or "
                "smaller images per request"
            )
            continue
        total += work.pixels


async def _decode(
    model: ModelVersion,
    work: _Work,
    pool: Executor,
    max_pixels: int,
    slots: asyncio.Semaphore,
    *,
    budget: PixelBudget | None,
    deadline: float,
    keep_image: bool,
) -> tuple[ImageOutcome, np.ndarray | None]:
    """Decode and preprocess one image in the pool, holding its pixels of the worker's budget meanwhile.

    The decode starts from the file :func:`_probe_one` opened (pre-scanned, header parsed), so
    neither is done twice.

    The pixels are reserved before the decode starts and returned when its thread ends, even
    when the request stopped waiting for it at its deadline (504), so the budget bounds what the
    decode threads really hold.

    Returns its outcome so far and its (C, H, W) input (None when it failed).
    """
    if work.error is not None:
        return ImageOutcome(work.index, None, None, work.error, work.seconds), None
    opened, work.opened = work.opened, None  # the decode consumes it
    assert opened is not None
    now = model.batcher.clock.now
    async with slots:
        started = time.perf_counter()
        try:
            with tracing.decoding():
                if budget is not None:
                    await budget.acquire(work.pixels, max(deadline - now(), 0.0))
                try:
                    future = asyncio.get_running_loop().run_in_executor(
                        pool, _decode_and_preprocess, model, opened, max_pixels, keep_image
                    )
                except BaseException:
                    if budget is not None:
                        budget.release(work.pixels)
                    raise
                if budget is not None:
                    future.add_done_callback(lambda _: budget.release(work.pixels))
                decoded, x = await _until(deadline, now, future, "decoded")
        except ProblemError as exc:
            return ImageOutcome(work.index, None, None, exc, work.seconds + time.perf_counter() - started), None
        except Exception as exc:  # a bug of ours (the decoder turns every fault of the file into a 4xx)
            error = _our_fault(model, work.index, exc)
            return ImageOutcome(work.index, None, None, error, work.seconds + time.perf_counter() - started), None
    decode_seconds = work.seconds + time.perf_counter() - started
    metrics.DECODE_DURATION.labels(model.name, str(model.version)).observe(decode_seconds)
    return ImageOutcome(work.index, decoded, None, None, decode_seconds), x


async def _submit(
    model: ModelVersion, outcome: ImageOutcome, x: np.ndarray | None, deadline: float | None
) -> ImageOutcome:
    if x is None:  # decoding failed: the outcome already holds its problem
        return outcome
    try:
        bucket = model.preprocessor.spec.bucket_for(x.shape[1], x.shape[2])
        padding = 0.0
        if bucket is not None:
            padding = 1.0 - x.shape[1] * x.shape[2] / (bucket[0] * bucket[1])
            metrics.PADDING_FRACTION.labels(model.name, str(model.version)).observe(padding)
        result = await model.batcher.submit(x, deadline=deadline, bucket=bucket)
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
    Unless ``keep_images`` (``render=png`` draws on the picture), the full-size picture is
    dropped as soon as it is preprocessed: an outcome keeps its sizes, not its pixels.

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
        keep_images: keep each outcome's decoded picture (``image.image``); else it is None.

    Returns:
        One outcome per payload, in request order; an image's own errors are in its outcome.

    Raises:
        BadRequest, Unavailable: from :meth:`~service.batching.batcher.Batcher.admit`: more images than
            the whole queue holds (400), or no room for all of them now (503, Retry-After).
    """
    model.batcher.admit(len(payloads))
    limits = limits or DecodeLimits()
    slots = asyncio.Semaphore(decode_parallelism)
    works = [_Work(i, data) for i, data in enumerate(payloads)]
    decode_deadline = deadline if deadline is not None else model.batcher.deadline()
    with model.batcher.arriving(len(payloads)):  # on their way: no lone input ahead of them takes the wide runner
        await asyncio.gather(
            *(_probe_one(model, work, pool, max_pixels, limits, slots, decode_deadline) for work in works)
        )
        _within_request_budget(works, limits.max_request_pixels)
        decoded = await asyncio.gather(
            *(
                _decode(model, work, pool, max_pixels, slots, budget=budget, deadline=decode_deadline,
                        keep_image=keep_images)
                for work in works
            )
        )  # fmt: skip
    model.batcher.admit(sum(x is not None for _, x in decoded))
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
