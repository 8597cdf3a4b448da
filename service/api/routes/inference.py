"""Inference routes: thin wrappers over :mod:`service.inference`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from service import attention, metrics
from service.api.deps import Repository, State
from service.api.lifetime import requested_timeout, unless_disconnected
from service.api.openapi import CLASSIFICATION_SCHEMA, DETECTION_SCHEMA, PNG_CONTENT, image_responses
from service.api.responses import JSON
from service.api.uploads import OPENAPI_IMAGE_BODY, read_images
from service.errors import BadRequest, InvalidParameter, ProblemError, request_id
from service.inference import ImageOutcome, infer_images, response_body, server_timing
from service.render import png_bytes
from service.repository import ModelRepository, ModelVersion
from service.tasks import classification, detection

# Every inference route takes `?timeout=` / `X-Request-Timeout` (seconds, may only shorten request_timeout).
router = APIRouter(prefix="/v1/models", tags=["inference"], dependencies=[Depends(requested_timeout)])

Version = Annotated[str | None, Query(description="Model version; default: the highest", pattern=r"^[0-9]{1,9}$")]
Render = Callable[[ModelVersion], Callable[[ImageOutcome], dict[str, Any]]]
# Builds a response other than JSON from the body and the outcomes (e.g. a PNG); may raise ProblemError.
Encode = Callable[[dict[str, Any], list[ImageOutcome]], Awaitable[Response]]


def _require_task(model: ModelVersion, task: str) -> None:
    if model.manifest.task != task:
        other = "detect" if task == "classification" else "classify"
        raise BadRequest(
            f"model {model.name!r} is a {model.manifest.task} model; POST to /v1/models/{model.name}/{other}"
        )


async def _serve(
    request: Request,
    state: State,
    repository: ModelRepository,
    name: str,
    version: str | None,
    task: str,
    render: Render,
    encode: Encode | None = None,
) -> Response:
    """Look the model up, read the images, run them, render the body; count the outcome.

    The request's deadline is set on arrival; once its body is read, a client that disconnects
    cancels the work (its queued images are dropped) and is counted as ``cancelled``.

    ``encode``, when given, turns the rendered body into the response instead of JSON.
    """
    started = time.perf_counter()
    labels = (metrics.UNKNOWN_MODEL, "")
    try:
        model = repository.get(name, version)
        labels = (model.name, str(model.version))
        request.state.model, request.state.version = labels  # for the access log line
        deadline = model.batcher.deadline(getattr(request.state, "requested_timeout", None))
        _require_task(model, task)
        settings = state.settings
        payloads = await read_images(
            request,
            max_body_bytes=settings.max_body_bytes,
            max_images=settings.max_images_per_request,
            max_parts=settings.max_multipart_parts,
        )
        outcomes = await unless_disconnected(
            request,
            infer_images(
                model,
                payloads,
                pool=state.decode_pool,
                max_pixels=settings.max_image_pixels,
                deadline=deadline,
                decode_parallelism=state.decode_parallelism,
            ),
        )
        request.state.batch_sizes = [o.result.batch_size for o in outcomes if o.result is not None]
        body = response_body(model, outcomes, render(model), instance=request_id(request))
        response = await encode(body, outcomes) if encode is not None else JSON(body)
    except ProblemError as exc:
        metrics.observe_request(*labels, exc.outcome, time.perf_counter() - started)
        raise
    except Exception:
        metrics.observe_request(*labels, "error", time.perf_counter() - started)
        raise
    metrics.observe_request(*labels, "success", time.perf_counter() - started)
    response.headers["Server-Timing"] = server_timing(outcomes)
    return response


def _png_responses(schema: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """The image routes' responses, with a PNG (``render=png``) beside the JSON 200."""
    responses = image_responses(schema)
    ok = responses[200]
    responses[200] = {**ok, "content": {**ok["content"], **PNG_CONTENT}}
    return responses


@router.post(
    "/{name}/classify",
    summary="Classify one or more images",
    openapi_extra=OPENAPI_IMAGE_BODY,
    response_class=JSON,
    responses=_png_responses(CLASSIFICATION_SCHEMA),
)
async def classify(
    name: str,
    request: Request,
    repository: Repository,
    state: State,
    top_k: Annotated[int, Query(ge=1, description="How many classes to return; clamped to the label count")] = 5,
    version: Version = None,
    render_as: Annotated[
        Literal["json", "png"] | None,
        Query(
            alias="render",
            description="png: the attention-rollout heat map over the image (a ViT with attention maps; one image)",
        ),
    ] = None,
) -> Response:
    def render(model: ModelVersion) -> Callable[[ImageOutcome], dict[str, Any]]:
        logits_name, labels = model.manifest.outputs[0], model.manifest.labels
        return lambda outcome: {
            "predictions": classification.classify(outcome.result.outputs[logits_name], labels, top_k)
        }

    async def heat_map(body: dict[str, Any], outcomes: list[ImageOutcome]) -> Response:
        if len(outcomes) != 1:
            raise BadRequest(f"render=png draws one image; this request has {len(outcomes)}. Send one, or ask for JSON")
        model = repository.get(body["model"], body["version"])
        spec = model.manifest.attention
        if spec is None:
            raise InvalidParameter(
                f"model {model.name!r} version {model.version} exports no attention maps, so render=png has "
                "nothing to draw; ask for JSON, or use a ViT exported with them (e.g. vit-cifar10)"
            )
        decoded, outputs = outcomes[0].image, outcomes[0].result.outputs
        top = body["predictions"][0]
        drawn = await asyncio.get_running_loop().run_in_executor(
            state.decode_pool,
            lambda: attention.render_png(
                decoded.image,
                (decoded.width, decoded.height),
                outputs[spec.output],
                (spec.grid.height, spec.grid.width),
                model.preprocessor,
                caption=f"{top['label']} {top['score']:.2f}",
            ),
        )
        return Response(drawn, media_type="image/png")

    encode = heat_map if _wants_png(request, render_as) else None
    return await _serve(request, state, repository, name, version, "classification", render, encode)


def _wants_png(request: Request, render_as: str | None) -> bool:
    """``?render=png``; or no ``render`` and an ``Accept`` header that prefers image/png to JSON.

    Of ``image/png`` and ``application/json`` in ``Accept``, the higher quality value (RFC 9110,
    Sec. 12.4.2) wins, the one listed first on a tie; ``q=0`` means not acceptable. Wildcards
    (``image/*``, ``*/*``) do not ask for a picture.
    """
    if render_as is not None:
        return render_as == "png"
    best: tuple[float, int, str] | None = None
    for index, item in enumerate(request.headers.get("accept", "").split(",")):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() not in ("image/png", "application/json"):
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if best is None or (quality, -index) > best[:2]:
            best = (quality, -index, media.lower())
    return best is not None and best[2] == "image/png" and best[0] > 0


@router.post(
    "/{name}/detect",
    summary="Detect objects in one or more images",
    openapi_extra=OPENAPI_IMAGE_BODY,
    response_class=JSON,
    responses=_png_responses(DETECTION_SCHEMA),
)
async def detect(
    name: str,
    request: Request,
    repository: Repository,
    state: State,
    threshold: Annotated[float, Query(ge=0, le=1, description="Lowest score returned")] = 0.5,
    max_detections: Annotated[
        int, Query(ge=1, description="Most detections returned, best first; clamped to the number of queries")
    ] = 100,
    render_as: Annotated[
        Literal["json", "png"] | None,
        Query(alias="render", description="png: the image with its detections drawn (one image only)"),
    ] = None,
    version: Version = None,
) -> Response:
    def fields(model: ModelVersion) -> Callable[[ImageOutcome], dict[str, Any]]:
        logits_name, boxes_name = model.manifest.outputs[:2]
        labels, preprocessor = model.manifest.labels, model.preprocessor

        def one(outcome: ImageOutcome) -> dict[str, Any]:
            decoded = outcome.image
            displayed = (decoded.width, decoded.height)
            detections = detection.detect(
                outcome.result.outputs[logits_name],
                outcome.result.outputs[boxes_name],
                labels,
                threshold=threshold,
                max_detections=max_detections,
                box_scale=preprocessor.box_scale(decoded.image.size, displayed),
                image_size=displayed,
            )
            return {"detections": detections}

        return one

    async def png(body: dict[str, Any], outcomes: list[ImageOutcome]) -> Response:
        if len(outcomes) != 1:
            raise BadRequest(f"render=png draws one image; this request has {len(outcomes)}. Send one, or ask for JSON")
        decoded = outcomes[0].image
        drawn = await asyncio.get_running_loop().run_in_executor(
            state.decode_pool,
            lambda: png_bytes(
                detection.draw_detections(decoded.image, body["detections"], (decoded.width, decoded.height))
            ),
        )
        return Response(drawn, media_type="image/png")

    encode = png if _wants_png(request, render_as) else None
    return await _serve(request, state, repository, name, version, "detection", fields, encode)
