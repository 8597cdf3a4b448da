"""Inference routes: one generic handler serves every registered task at ``POST /v1/models/{name}/{verb}``.

What differs between tasks (query parameters, response fields, the picture of ``render=png``)
is declared by the task (:mod:`service.tasks`); this module only reads, runs and answers.
No ``from __future__ import annotations`` here: each route's signature names its task's
``Params`` class, which FastAPI must see as a class, not a string.
"""

import asyncio
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import Scope

from service import tasks
from service.core.errors import BadRequest, DeadlineExceeded
from service.http.accounting import accounted
from service.http.deps import State, Version, get_repository
from service.http.lifetime import (
    TIMEOUT_HEADER,
    body_by_deadline,
    deadline_passed_after_the_body,
    requested_timeout,
    unless_disconnected,
)
from service.http.openapi import PNG_CONTENT, image_responses
from service.http.problems import request_id
from service.http.responses import JSON, server_timing, timings
from service.http.uploads import OPENAPI_IMAGE_BODY, read_images
from service.pipeline.inference import ImageOutcome, infer_images, response_body
from service.runtime.repository import ModelVersion
from service.tasks import Task


def require_task(model: ModelVersion, task: Task[Any]) -> None:
    """Refuse (400) a request for a task the model does not serve, naming the route it does serve.

    Raises:
        BadRequest: ``task`` is neither the model's own nor a companion whose roles it names.
    """
    if tasks.serves(model.manifest, task):
        return
    own = tasks.get(model.manifest.task)
    served = [t.verb for t in tasks.served_tasks(model.manifest)]
    also = f" (it serves {', '.join(served)})" if len(served) > 1 else ""
    if task.companion:
        raise BadRequest(
            f"model {model.name!r} version {model.version} has no {', '.join(task.roles)} output, so it cannot "
            f"{task.verb}; POST to /v1/models/{model.name}/{own.verb}{also}"
        )
    raise BadRequest(
        f"model {model.name!r} is a {model.manifest.task} model; POST to /v1/models/{model.name}/{own.verb}{also}"
    )


def _options(task: Task[Any]) -> frozenset[str]:
    """The query parameters of ``task``'s route, which a multipart form field of the same name is refused for."""
    return frozenset(task.Params.model_fields).union(("version", "timeout"))


def _prefers_png(request: Request) -> bool:
    """Whether the ``Accept`` header prefers image/png to JSON.

    Of ``image/png`` and ``application/json`` in ``Accept``, image/png must have the strictly
    higher quality value (RFC 9110, Sec. 12.4.2), or be listed without JSON; on a tie the
    server's default, JSON, wins (the order of the list carries no preference). ``q=0`` means
    not acceptable. Wildcards (``image/*``, ``*/*``) do not ask for a picture.
    """
    quality: dict[str, float] = {}
    for item in request.headers.get("accept", "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        media = media.lower()
        if media not in ("image/png", "application/json"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality[media] = max(q, quality.get(media, 0.0))
    png = quality.get("image/png", 0.0)
    return png > 0 and png > quality.get("application/json", 0.0)


def _wants_png(request: Request, render_as: str | None) -> bool:
    """``?render=png``; or no ``render`` and an ``Accept`` header that prefers image/png (:func:`_prefers_png`)."""
    if render_as is not None:
        return render_as == "png"
    return _prefers_png(request)


async def _picture(
    state: State,
    task: Task[Any],
    model: ModelVersion,
    body: dict[str, Any],
    outcomes: list[ImageOutcome],
    params: Any,
    deadline: float,
) -> tuple[Response, float]:
    """The task's picture of a one-image request (``outcomes``) and the seconds it took, drawn in the render pool.

    One picture is drawn at a time per worker (``state.render_pool``: one thread), never in the
    decode pool, so a large picture cannot hold up other requests' decoding; waiting for it and
    drawing it count against the request's deadline.

    Raises:
        DeadlineExceeded: the deadline passed before the picture was drawn (504).
    """
    clock = model.batcher.clock
    started = clock.now()
    drawn = asyncio.get_running_loop().run_in_executor(
        state.render_pool, task.picture, model, outcomes[0], body, params
    )
    try:
        async with asyncio.timeout(max(deadline - started, 0.0)):
            png = await drawn
    except TimeoutError:
        raise DeadlineExceeded(
            "the request's deadline passed while its picture waited to be drawn or was being drawn (pictures "
            "are drawn one at a time); give it a longer timeout (?timeout=, X-Request-Timeout, up to "
            "PATCHSERVE_REQUEST_TIMEOUT), or ask for JSON"
        ) from None
    return Response(png, media_type="image/png"), clock.now() - started


async def serve(
    request: Request,
    state: State,
    name: str,
    version: str | None,
    task: Task[Any],
    params: BaseModel,
) -> Response:
    """Look the model up, read the images, run them, answer with the task's fields; count the outcome.

    The request's deadline is set on arrival; once its body is read, a client that disconnects
    cancels the work (its queued images are dropped) and is counted as ``cancelled``.
    """
    # the repository inside the account: a 503 while the models load is counted too
    with accounted(request.state) as account, (await get_repository(request)).use(name, version) as model:
        account.model(model.name, model.version)
        deadline = model.batcher.deadline(getattr(request.state, "requested_timeout", None))
        require_task(model, task)
        settings = state.settings
        render_as = getattr(params, "render", None)
        picture = task.picture_help is not None and _wants_png(request, render_as)
        payloads = await body_by_deadline(
            read_images(
                request,
                max_body_bytes=settings.max_body_bytes,
                max_images=settings.max_images_per_request,
                max_parts=settings.max_multipart_parts,
                pool=state.decode_pool,
                options=_options(task),
            ),
            deadline - model.batcher.clock.now(),
            request,
            settings.max_body_bytes,
        )
        # after the body: a client that writes all of it before reading gets this answer, not a reset
        if task.picture_help is None and request.query_params.get("render", "json") != "json":
            drawn = ", ".join(t.verb for t in tasks.all_tasks() if t.picture_help is not None)
            raise BadRequest(f"{task.verb} draws no picture (render=png is for {drawn}); leave render out for JSON")
        if model.batcher.clock.now() >= deadline:  # say so, not "while this image was being decoded"
            raise deadline_passed_after_the_body()
        if picture and render_as is None and (len(payloads) != 1 or not task.draws(model)):
            picture = False  # Accept: image/png is a preference: JSON when there is no one picture to draw
        if picture and len(payloads) != 1:  # asked for by name: refused before any image is decoded
            raise BadRequest(f"render=png draws one image; this request has {len(payloads)}. Send one, or ask for JSON")
        outcomes = await unless_disconnected(
            request,
            infer_images(
                model,
                payloads,
                pool=state.decode_pool,
                max_pixels=settings.max_image_pixels,
                deadline=deadline,
                decode_parallelism=state.decode_parallelism,
                limits=state.decode_limits,
                budget=state.pixel_budget,
                keep_images=picture,  # render=png draws on the decoded picture
            ),
        )
        request.state.batch_sizes = [o.result.batch_size for o in outcomes if o.result is not None]
        body = response_body(model, outcomes, lambda o: task.fields(model, o, params), instance=request_id(request))
        phases = timings(outcomes)
        if picture:
            drawing = _picture(state, task, model, body, outcomes, params, deadline)
            response, phases["render"] = await unless_disconnected(request, drawing)  # gone: not drawn
        else:
            response = JSON(body)
    response.headers["Server-Timing"] = server_timing(**phases)
    if task.picture_help is not None:  # the same URL answers JSON or a PNG by Accept: caches must key on it
        response.headers["Vary"] = "Accept"
    return response


def _responses(task: Task[Any]) -> dict[int | str, dict[str, Any]]:
    """The task's route responses: its result schema, with a PNG beside the JSON 200 when it draws one."""
    responses = image_responses(task.result_schema)
    if task.picture_help is not None:
        ok = responses[200]
        responses[200] = {**ok, "content": {**ok["content"], **PNG_CONTENT}}
    return responses


def _endpoint(task: Task[Any]) -> Callable[..., Coroutine[Any, Any, Response]]:
    """The route function of ``task``: its ``Params`` as query parameters, then :func:`serve`."""
    params_type = task.Params

    async def endpoint(
        name: str,
        request: Request,
        state: State,
        params: Annotated[params_type, Query()],  # type: ignore[valid-type]
        version: Version = None,
    ) -> Response:
        return await serve(request, state, name, version, task, params)

    endpoint.__name__ = task.verb
    return endpoint


_TIMEOUT_HEADER = TIMEOUT_HEADER.lower().encode("latin-1")
PREFIX = "/v1/models/"  # of every inference route: PREFIX + "{name}/{verb}"


def direct_handler(task: Task[Any]) -> Callable[[Request], Coroutine[Any, Any, Response]] | None:
    """``task``'s handler of a request with nothing to validate, without FastAPI's solver (None: none).

    A request with no query string and no ``X-Request-Timeout`` header has nothing for the
    route's dependencies to read: its parameters are ``task.Params()``'s defaults, the highest
    version and no requested timeout. FastAPI's dependency solver still took a third of the event
    loop's Python time for such a request (fastapi 0.165, cProfile, ``vit-cifar10``); without it
    the loop's CPU per request fell by about 0.2 ms on a 2-core VM (``python -m bench.loop_cpu``;
    docs/performance.md). The handler calls :func:`serve` directly; it is given only such requests
    (:func:`needs_validation` is checked first, by the route and by the direct path,
    :class:`~service.http.direct.DirectInference`), and every other takes FastAPI's own handler,
    so validation, its errors and the OpenAPI document (built from the endpoint's signature) are
    unchanged. It does not look at ``app.dependency_overrides`` (the server sets none). None when
    ``task.Params`` has a required field: every request must then be validated.
    """
    try:
        task.Params()
    except ValidationError:
        return None

    async def handler(request: Request) -> Response:
        request.state.requested_timeout = None
        state = request.app.state.server
        return await serve(request, state, request.scope["path_params"]["name"], None, task, task.Params())

    return handler


def needs_validation(scope: Scope) -> bool:
    """Whether an inference request has something for its route to validate: a query string, ``X-Request-Timeout``."""
    return bool(scope["query_string"]) or any(key == _TIMEOUT_HEADER for key, _ in scope["headers"])


class InferenceRoute(APIRoute):
    """An inference route: FastAPI's handler for a request to validate, :attr:`direct` for the rest."""

    direct: Callable[[Request], Coroutine[Any, Any, Response]] | None = None


def _route_class(task: Task[Any]) -> type[APIRoute]:
    """An :class:`InferenceRoute` for ``task`` that answers a request with nothing to validate by
    :func:`direct_handler`, and keeps it as :attr:`InferenceRoute.direct` for the direct path."""
    direct = direct_handler(task)

    class TaskRoute(InferenceRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            general = super().get_route_handler()
            if direct is None:
                return general

            async def handler(request: Request) -> Response:
                if needs_validation(request.scope):
                    return await general(request)
                return await direct(request)

            return handler

    TaskRoute.direct = staticmethod(direct) if direct is not None else None  # a function, not a method
    return TaskRoute


def build_router() -> APIRouter:
    """One route per registered task, ``POST /v1/models/{name}/{verb}``, all served by :func:`serve`.

    Every route takes ``?timeout=`` / ``X-Request-Timeout`` (seconds, may only shorten
    request_timeout). Built by the app factory, so a task registered before it is served.
    """
    router = APIRouter(prefix=PREFIX.rstrip("/"), tags=["inference"], dependencies=[Depends(requested_timeout)])
    for task in tasks.all_tasks():
        router.add_api_route(
            f"/{{name}}/{task.verb}",
            _endpoint(task),
            methods=["POST"],
            summary=task.summary,
            openapi_extra=OPENAPI_IMAGE_BODY,
            response_class=JSON,
            responses=_responses(task),
            route_class_override=_route_class(task),
        )
    return router
