"""Reading and decoding a request's images in the decode pool, within the pixel budgets (issue 15 F).

Each image's header is read first (the JPEG and PNG pre-scan included), its decoded pixels
checked against the request's total and reserved from the worker's budget, then it is decoded
and preprocessed; a request's only image does all of it in one trip to the pool
(:func:`decode_alone`), several images in two (:func:`probe_one`, then :func:`decode_one`), so
that the request's total is checked in request order before any is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from service.batching.alone import LoneRun
from service.batching.config import InferenceResult
from service.core import metrics, tracing
from service.core.errors import (
    ImageProcessingFailed,
    InferenceFailed,
    PayloadTooLarge,
    ProblemError,
    release_frames,
)
from service.imaging.images import LINE_PIXELS, DecodedImage, OpenedImage, decode_image, open_image
from service.imaging.pixel_budget import PixelBudget
from service.imaging.preprocess import Preprocessor
from service.imaging.prescan_limits import PrescanLimits
from service.pipeline.pool import in_pool, until
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
    return (decoded.for_picture() if keep_image else decoded.dropped()), x


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
    release_frames(exc)
    return ImageProcessingFailed(
        f"decoding or preprocessing this image failed on the server's side ({type(exc).__name__}), a "
        "fault of ours, not of the image; the server log has the details"
    )


@dataclass
class Work:
    """One image on its way through the request: its file, what it decodes to, its outcome so far."""

    index: int
    data: bytes
    pixels: int = 0  # what it holds while decoded, in pixels' worth: OpenedImage.cost
    opened: OpenedImage | None = None  # pre-scanned, header parsed: decoded from here, not from data again
    error: ProblemError | None = None
    seconds: float = 0.0


async def probe_one(
    model: ModelVersion,
    work: Work,
    pool: Executor,
    max_pixels: int,
    limits: DecodeLimits,
    slots: asyncio.Semaphore,
    deadline: float,
) -> None:
    """Read what ``work``'s file decodes to, from its header (pre-scan included), in the pool."""
    async with slots:
        started = time.perf_counter()
        try:
            future, job = in_pool(pool, _probe, model, work.data, max_pixels, limits.prescan)
            work.opened = await until(deadline, model.batcher.clock.now, future, "this image was being read", job)
            work.pixels = work.opened.cost
        except ProblemError as exc:
            work.error = release_frames(exc)  # kept until the request is answered: its frames are not
        except Exception as exc:
            work.error = _our_fault(model, work.index, exc)
        work.seconds += time.perf_counter() - started
    if work.error is not None:
        _trace_failed_decode(work.error)


def _trace_failed_decode(error: ProblemError) -> None:
    """The ``decode`` span of an image refused from its header: failed, as if its decode had failed."""
    with contextlib.suppress(ProblemError), tracing.decoding():
        raise error
    release_frames(error)  # raised again: its new traceback holds this frame, and the caller's


def _open_and_decode(
    model: ModelVersion,
    data: bytes,
    max_pixels: int,
    limits: DecodeLimits,
    budget: PixelBudget | None,
    held: list[int],
    keep_image: bool,
    lone: LoneRun | None,
    deadline: float,
) -> tuple[OpenedImage, tuple[DecodedImage, np.ndarray] | None, InferenceResult | InferenceFailed | None]:
    """Blocking, in the decode pool: read the header and, when nothing stands in the way, decode (and run).

    The decode follows at once when the image fits the request's pixel limit and its pixels fit
    the ``budget`` now (:meth:`PixelBudget.try_acquire`; they are then in ``held[0]``, for the
    loop to give back); else the second part is None and the loop takes the opened file on
    (the 413, or a wait for room) as a request of several images does. With a ``lone`` runner
    claimed (:mod:`service.batching.alone`) and an image cheap enough to keep it, the model runs
    here too, and the third part is its result (or its run's 500); else None (also when the
    request was abandoned or its ``deadline`` passed meanwhile: :meth:`LoneRun.__call__`).
    """
    opened = _probe(model, data, max_pixels, limits.prescan)
    if lone is not None and not lone.affordable(opened.cost):
        lone.give_up()  # its decode may be long: no batch waits for it
        lone = None
    if opened.cost > limits.max_request_pixels:
        return opened, None, None
    if budget is not None:
        if not budget.try_acquire(opened.cost):
            return opened, None, None
        held[0] = opened.cost
    decoded, x = _decode_and_preprocess(model, opened, max_pixels, keep_image)
    if lone is None:
        return opened, (decoded, x), None
    try:
        bucket = model.preprocessor.spec.bucket_for(x.shape[1], x.shape[2])
    except ValueError:  # fits no bucket: the batching path's 413
        return opened, (decoded, x), None
    return opened, (decoded, x), lone(x, bucket, deadline)


async def decode_alone(
    model: ModelVersion,
    work: Work,
    pool: Executor,
    max_pixels: int,
    limits: DecodeLimits,
    *,
    budget: PixelBudget | None,
    deadline: float,
    keep_image: bool,
    lone: LoneRun | None = None,
) -> tuple[ImageOutcome, np.ndarray | None]:
    """A request's only image, read and decoded in one trip to the pool (:func:`_open_and_decode`).

    The same checks in the same order as :func:`probe_one` then :func:`decode_one`, which it
    falls back to when the image must wait for decoding room or is refused for its size; one
    hand-off to the pool and back instead of two (issue 14, item 4). With ``lone``, a runner
    claimed for it (:meth:`Batcher.claim_alone`), the model runs in the same trip when the image
    is cheap to decode: the outcome then holds its result (or the run's 500), and the claim is
    released when the thread ends, whatever happened.
    """
    started = time.perf_counter()
    held = [0]
    try:
        with tracing.decoding():
            try:
                future, job = in_pool(
                    pool,
                    _open_and_decode,
                    model,
                    work.data,
                    max_pixels,
                    limits,
                    budget,
                    held,
                    keep_image,
                    lone,
                    deadline,
                )
            except BaseException:
                if lone is not None:
                    lone.release()
                raise
            if lone is not None:
                claim = lone  # narrowed for the callback
                future.add_done_callback(lambda _: claim.release())  # when the thread ends, even after a 504
            if budget is not None:
                pixels_budget = budget  # narrowed for the callback

                def give_back(_: object) -> None:  # when the thread ends, even after a 504
                    if held[0]:
                        pixels_budget.release(held[0])

                future.add_done_callback(give_back)
            try:
                opened, done, ran = await until(
                    deadline, model.batcher.clock.now, future, "this image was being decoded", job
                )
            except BaseException:  # a 504, or the client left: the thread must not run the model for nobody
                if lone is not None:
                    lone.abandon()
                raise
    except ProblemError as exc:
        return ImageOutcome(work.index, None, None, release_frames(exc), time.perf_counter() - started), None
    except Exception as exc:  # a bug of ours (the decoder turns every fault of the file into a 4xx)
        error = _our_fault(model, work.index, exc)
        return ImageOutcome(work.index, None, None, error, time.perf_counter() - started), None
    if done is None:  # too large for the request, or no room now: the two-step path takes it on
        work.opened, work.pixels, work.seconds = opened, opened.cost, time.perf_counter() - started
        within_request_budget([work], limits.max_request_pixels)
        return await decode_one(
            model, work, pool, max_pixels, asyncio.Semaphore(1), budget=budget, deadline=deadline,
            keep_image=keep_image,
        )  # fmt: skip
    decoded, x = done
    decode_seconds = time.perf_counter() - started - (lone.seconds if lone is not None else 0.0)  # not its run
    metrics.DECODE_DURATION.labels(model.name, str(model.version)).observe(decode_seconds)
    if isinstance(ran, InferenceFailed):
        return ImageOutcome(work.index, None, None, ran, decode_seconds), None
    return ImageOutcome(work.index, decoded, ran, None, decode_seconds), x


def within_request_budget(works: list[Work], max_request_pixels: int) -> None:
    """In request order, refuse (413) each image that would take the request past ``max_request_pixels``."""
    total = 0
    for work in works:
        if work.error is not None:
            continue
        if total + work.pixels > max_request_pixels:
            worth = f"this image decodes to {work.pixels} pixels' worth (its pixels and {LINE_PIXELS} a row or column)"
            work.error = PayloadTooLarge(
                f"{worth}, more than one request's images may decode to together ({max_request_pixels}, "
                "PATCHSERVE_MAX_REQUEST_PIXELS), even alone; send a smaller image"
                if total == 0
                else f"{worth}, which would take this request's images past {max_request_pixels} decoded pixels "
                "together (PATCHSERVE_MAX_REQUEST_PIXELS); send fewer or smaller images per request"
            )
            continue
        total += work.pixels


async def decode_one(
    model: ModelVersion,
    work: Work,
    pool: Executor,
    max_pixels: int,
    slots: asyncio.Semaphore,
    *,
    budget: PixelBudget | None,
    deadline: float,
    keep_image: bool,
) -> tuple[ImageOutcome, np.ndarray | None]:
    """Decode and preprocess one image in the pool, holding its pixels of the worker's budget meanwhile.

    The decode starts from the file :func:`probe_one` opened (pre-scanned, header parsed), so
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
                    future, job = in_pool(pool, _decode_and_preprocess, model, opened, max_pixels, keep_image)
                except BaseException:
                    if budget is not None:
                        budget.release(work.pixels)
                    raise
                if budget is not None:
                    future.add_done_callback(lambda _: budget.release(work.pixels))
                decoded, x = await until(deadline, now, future, "this image was being decoded", job)
        except ProblemError as exc:
            seconds = work.seconds + time.perf_counter() - started
            return ImageOutcome(work.index, None, None, release_frames(exc), seconds), None
        except Exception as exc:  # a bug of ours (the decoder turns every fault of the file into a 4xx)
            error = _our_fault(model, work.index, exc)
            return ImageOutcome(work.index, None, None, error, work.seconds + time.perf_counter() - started), None
    decode_seconds = work.seconds + time.perf_counter() - started
    metrics.DECODE_DURATION.labels(model.name, str(model.version)).observe(decode_seconds)
    return ImageOutcome(work.index, decoded, None, None, decode_seconds), x
