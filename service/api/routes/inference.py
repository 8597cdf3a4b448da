"""Inference routes: thin wrappers over :mod:`service.inference`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from service import postprocess
from service.api.deps import Repository, State
from service.api.responses import JSON
from service.api.uploads import OPENAPI_IMAGE_BODY, read_images
from service.errors import BadRequest, request_id
from service.inference import ImageOutcome, infer_images, response_body, server_timing
from service.repository import ModelVersion

router = APIRouter(prefix="/v1/models", tags=["inference"])

Version = Annotated[str | None, Query(description="Model version; default: the highest", pattern=r"^\d{1,9}$")]


def _require_task(model: ModelVersion, task: str) -> None:
    if model.manifest.task != task:
        other = "detect" if task == "classification" else "classify"
        raise BadRequest(
            f"model {model.name!r} is a {model.manifest.task} model; POST to /v1/models/{model.name}/{other}"
        )


async def _run(request: Request, state: State, model: ModelVersion) -> list[ImageOutcome]:
    settings = state.settings
    payloads = await read_images(
        request, max_body_bytes=settings.max_body_bytes, max_images=settings.max_images_per_request
    )
    return await infer_images(model, payloads, pool=state.decode_pool, max_pixels=settings.max_image_pixels)


@router.post(
    "/{name}/classify",
    summary="Classify one or more images",
    openapi_extra=OPENAPI_IMAGE_BODY,
    response_class=JSON,
)
async def classify(
    name: str,
    request: Request,
    repository: Repository,
    state: State,
    top_k: Annotated[int, Query(ge=1, description="How many classes to return; clamped to the label count")] = 5,
    version: Version = None,
) -> Response:
    model = repository.get(name, version)
    _require_task(model, "classification")
    outcomes = await _run(request, state, model)
    labels = model.manifest.labels

    def render(outcome: ImageOutcome) -> dict[str, Any]:
        logits = outcome.result.outputs[model.manifest.outputs[0]]  # (num_classes,)
        return {"predictions": postprocess.classify(logits, labels, top_k)}

    body = response_body(model, outcomes, render, instance=request_id(request))
    return JSON(body, headers={"Server-Timing": server_timing(outcomes)})
