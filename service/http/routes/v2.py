"""The Open Inference Protocol (KServe v2) REST endpoints, for tritonclient, KServe and Triton users.

Health, server and model metadata, model readiness, Triton's model configuration, and ``infer``
on each model's raw input tensor (:mod:`service.v2.tensor_inference`). Every error of these
routes is the protocol's ``{"error": "<message>"}`` with the status the rest of the API would
use (400 bad request, 404 unknown model, 413 too large, 503 queue full or not loaded, 504 past
its deadline, 500 only for a failed model run); a "not ready" answer is a 400, as the
protocol's health API specifies (a 4xx means false).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.core.codings import content_coding
from service.core.errors import BadRequest, ProblemError, release_frames
from service.core.json_bounds import PARSE_ON_LOOP_BYTES
from service.http.accounting import accounted
from service.http.deps import Repository, State, Version, get_repository
from service.http.lifetime import body_by_deadline, hold_more_body, requested_timeout, unless_disconnected
from service.http.methods import catch_all, not_allowed
from service.http.middleware.access_log import logged_path
from service.http.problems import count_refused_inference, protocol_error_response, unexpected
from service.http.responses import server_timing
from service.http.state import ServerState
from service.http.uploads import read_body
from service.pipeline.pool import in_pool, until
from service.runtime.repository import ModelVersion
from service.runtime.sessions import CUDA
from service.runtime.version_policy import ConfigError
from service.v2.openapi import (
    CONFIG_SCHEMA,
    INFER_BODY,
    INFER_RESPONSE_SCHEMA,
    LIVE_SCHEMA,
    MODEL_METADATA_SCHEMA,
    READY_SCHEMA,
    SERVER_METADATA_SCHEMA,
    v2_responses,
)
from service.v2.protocol import (
    HEADER_LENGTH,
    InferRequest,
    encode_infer_response,
    inflate,
    parse_infer_request,
)
from service.v2.tensor_inference import dims, infer_tensors, input_datatype, mask_input, max_values, output_specs

log = logging.getLogger(__name__)

# The protocol extensions this server implements (reported by server metadata, as Triton does).
EXTENSIONS = ["binary_tensor_data", "classification", "model_configuration", "model_repository"]
PLATFORM = "onnxruntime_onnx"
# The protocol's health probes: like /healthz and /readyz, admission never refuses them.
PROBE_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
MODEL_READY = re.compile(r"/v2/models/[^/]+(?:/versions/[^/]+)?/ready")  # KServe probes a model's too
INFER_RESPONSES = v2_responses(INFER_RESPONSE_SCHEMA, 400, 404, 408, 413, 415, 500, 504, binary=True)


_PLACES = {"query": "query parameter", "header": "header", "path": "path parameter"}


def _validation_detail(exc: RequestValidationError) -> str:
    """FastAPI's validation errors, each naming what was wrong, as sent: ``header 'x-request-timeout': ...``."""
    parts = []
    for error in exc.errors():
        place, *name = [str(part) for part in error.get("loc", ())] or ["request"]
        where = f"{_PLACES[place]} {'.'.join(name)!r}" if place in _PLACES and name else ".".join([place, *name])
        parts.append(f"{where}: {error.get('msg')}")
    return "; ".join(parts) or "invalid request"


class ProtocolRoute(APIRoute):
    """An ``APIRoute`` whose errors, domain or framework, are rendered as ``{"error": "..."}``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = _error_answer(request, exc)
                release_frames(exc)
                return answer

        return run


def _error_answer(request: Request, exc: Exception) -> Response:
    """``{"error"}`` with the status the rest of the API would give ``exc``."""
    if isinstance(exc, ProblemError):
        return protocol_error_response(exc.status, exc.detail, exc.headers)
    if isinstance(exc, RequestValidationError):  # the app's handler, which counts it, never sees it
        count_refused_inference(request)
        return protocol_error_response(400, _validation_detail(exc))
    if isinstance(exc, StarletteHTTPException):
        return protocol_error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))
    error = unexpected(exc, f"{request.method} {logged_path(request.url.path)}")
    return protocol_error_response(error.status, error.detail)


router = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"], route_class=ProtocolRoute)


@router.get("", summary="Server metadata: name, version, extensions", responses=v2_responses(SERVER_METADATA_SCHEMA))
async def server_metadata(request: Request) -> dict[str, Any]:
    return {"name": "patchserve", "version": request.app.version, "extensions": EXTENSIONS}


@router.get(
    "/health/live", summary="Server liveness: 200 while the process serves", responses=v2_responses(LIVE_SCHEMA)
)
@router.head("/health/live", include_in_schema=False)
async def server_live() -> dict[str, bool]:
    return {"live": True}


@router.get(
    "/health/ready",
    summary="Server readiness: 200 once every model is ready, else 400 with the reason",
    responses=v2_responses(READY_SCHEMA, 400),
)
@router.head("/health/ready", include_in_schema=False)
async def server_ready(state: State) -> dict[str, bool]:
    reasons = state.not_ready_reasons()
    if reasons:
        raise BadRequest("not ready: " + "; ".join(reasons))
    return {"ready": True}


def _metadata(model: ModelVersion, repository: Repository, *, versioned: bool) -> dict[str, Any]:
    """The KServe v2 model metadata; ``versions``: the named version alone when the path names one, else
    every served version (Triton's ``TRITONSERVER_ServerModelMetadata``)."""
    spec = model.manifest.input
    return {
        "name": model.name,
        "versions": [str(model.version)] if versioned else [str(v) for v in sorted(repository.models[model.name])],
        "platform": PLATFORM,
        "inputs": [{"name": spec.name, "datatype": input_datatype(model), "shape": dims(spec.shape)}]
        + [{"name": name, "datatype": "INT64", "shape": [-1, -1, -1]} for name in mask_input(model)],
        "outputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in output_specs(model)],
    }


@router.get(
    "/models/{name}",
    summary="Model metadata: input and output tensors (-1: any size)",
    responses=v2_responses(MODEL_METADATA_SCHEMA, 400, 404),
)
async def model_metadata(name: str, repository: Repository) -> dict[str, Any]:
    return _metadata(repository.get(name), repository, versioned=False)


@router.get(
    "/models/{name}/versions/{version}",
    summary="Model metadata of one version",
    responses=v2_responses(MODEL_METADATA_SCHEMA, 400, 404),
)
async def model_version_metadata(name: str, version: str, repository: Repository) -> dict[str, Any]:
    return _metadata(repository.get(name, version), repository, versioned=True)


def _ready(state: State, name: str, version: str | None) -> dict[str, Any]:
    if state.repository is None:
        raise BadRequest(f"not ready: {state.startup_error or 'the models are still loading'}")
    model = state.repository.get(name, version)
    if not model.ready:
        raise BadRequest(f"model {model.name} version {model.version} is not ready: {model.not_ready_reason}")
    return {"name": model.name, "ready": True}


@router.get(
    "/models/{name}/ready",
    summary="Model readiness: 200 when ready, else 400 (404: no such model)",
    responses=v2_responses(READY_SCHEMA, 400, 404),
)
async def model_ready(name: str, state: State) -> dict[str, Any]:
    return _ready(state, name, None)


@router.get(
    "/models/{name}/versions/{version}/ready",
    summary="Readiness of one model version",
    responses=v2_responses(READY_SCHEMA, 400, 404),
)
async def model_version_ready(name: str, version: str, state: State) -> dict[str, Any]:
    return _ready(state, name, version)


def _version_policy(model: ModelVersion, state: ServerState) -> dict[str, Any]:
    """The model's version policy as Triton writes it (``config.json``'s or the load API's).

    ``specific`` with this version alone when it cannot be read (no model control, or a
    ``config.json`` made invalid after the start: the versions serving keep serving). Versions are
    JSON integers, as Triton writes them (its ``ModelConfigToJson`` turns protobuf's int64 strings
    back into numbers for ``version_policy.specific.versions``).
    """
    try:
        if state.control is not None:
            return state.control.policy(model.name).describe()
    except ConfigError:
        pass
    return {"specific": {"versions": [int(model.version)]}}


def _config(model: ModelVersion, max_rows: int, version_policy: dict[str, Any]) -> dict[str, Any]:
    """Triton's model configuration (model_config.proto as JSON) for tritonclient's get_model_config.

    ``max_batch_size`` is what one infer request may carry (``max_rows``, the batch size an infer
    is accepted with, and no more than the model's ``queue_size``; more is a 400), as in Triton,
    where it bounds a request's batch dimension.
    The batcher's own largest batch, which it picks itself and may change while serving, is
    ``dynamic_batching.preferred_batch_size``, read at each call. ``instance_group.count`` is
    the sessions the batcher feeds.
    """

    def data_type(datatype: str) -> str:
        return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype

    batching = model.batcher.config
    spec = model.manifest.input
    kind = "KIND_GPU" if model.runner.providers.primary == CUDA else "KIND_CPU"
    return {
        "name": model.name,
        "platform": PLATFORM,
        "backend": "onnxruntime",
        "version_policy": version_policy,
        "max_batch_size": min(max_rows, batching.queue_size),
        "input": [
            {
                "name": spec.name,
                "data_type": data_type(input_datatype(model)),
                "format": "FORMAT_NCHW",
                "dims": dims(spec.shape)[1:],
            }
        ]
        + [{"name": name, "data_type": "TYPE_INT64", "dims": [-1, -1], "optional": True} for name in mask_input(model)],
        "output": [{"name": n, "data_type": data_type(t), "dims": s[1:]} for n, t, s in output_specs(model)],
        "dynamic_batching": {
            "preferred_batch_size": [batching.max_batch_size],
            "max_queue_delay_microseconds": round(batching.max_queue_delay * 1e6),
            "default_queue_policy": {
                "max_queue_size": batching.queue_size,
                "default_timeout_microseconds": round(batching.request_timeout * 1e6),
                "timeout_action": "REJECT",
            },
        },
        "instance_group": [{"count": model.batcher.instances, "kind": kind}],
    }


@router.get(
    "/models/{name}/config",
    summary="Triton model configuration (model_configuration extension)",
    responses=v2_responses(CONFIG_SCHEMA, 400, 404),
)
async def model_config(name: str, repository: Repository, state: State) -> dict[str, Any]:
    model = repository.get(name)
    return _config(model, state.settings.max_images_per_request, _version_policy(model, state))


@router.get(
    "/models/{name}/versions/{version}/config",
    summary="Triton model configuration of one version",
    responses=v2_responses(CONFIG_SCHEMA, 400, 404),
)
async def model_version_config(name: str, version: str, repository: Repository, state: State) -> dict[str, Any]:
    model = repository.get(name, version)
    return _config(model, state.settings.max_images_per_request, _version_policy(model, state))


async def _parsed(
    request: Request, state: ServerState, model: ModelVersion, body: bytes, deadline: float
) -> tuple[InferRequest, float]:
    """The request's body inflated and parsed, and the parse's seconds; a large one in decode threads.

    Never on the event loop for more than :data:`PARSE_ON_LOOP_BYTES`: 40 gzip bodies of 20 KB,
    each 20 MB of JSON once inflated (0.25 s to parse and refuse), held the worker's health probes up
    for 9 s (a fresh user's). A job still queued when the deadline passes or the caller is cancelled
    (the client left) never runs.

    Raises:
        DeadlineExceeded: the deadline passed first (504).
        ClientDisconnected: the client left while its body was inflated or parsed.
        ProblemError: :func:`inflate`'s and :func:`parse_infer_request`'s errors.
    """
    settings, clock = state.settings, model.batcher.clock
    encoding = content_coding(request.headers.getlist("content-encoding"))
    if encoding is not None:
        future, job = in_pool(state.decode_pool, inflate, body, encoding, settings.max_body_bytes)
        body = await unless_disconnected(
            request, until(deadline, clock.now, future, "its body was being inflated", job)
        )
        hold_more_body(request, len(body))  # held beside the compressed body until answered: both count
    parse = functools.partial(
        _timed_parse, body, request.headers.get(HEADER_LENGTH), max_values(model, settings.max_images_per_request)
    )
    if len(body) <= PARSE_ON_LOOP_BYTES:
        return parse()
    future, job = in_pool(state.decode_pool, parse)
    parsed: tuple[InferRequest, float] = await unless_disconnected(
        request, until(deadline, clock.now, future, "its body was being parsed", job)
    )
    return parsed


def _timed_parse(body: bytes, header_length: str | None, limit: int | None) -> tuple[InferRequest, float]:
    started = time.perf_counter()
    return parse_infer_request(body, header_length, limit), time.perf_counter() - started


async def _infer(request: Request, state: State, name: str, version: str | None) -> Response:
    """Read, parse, run and encode one inference request; count its outcome.

    The deadline runs from arrival: the server's ``request_timeout``, shortened by ``?timeout=``
    or ``X-Request-Timeout`` (seconds, as on ``/v1``) and by the request's ``timeout``
    parameter (microseconds, Triton's). Once the body is read, a client that disconnects
    cancels the work (its queued rows are dropped), counted as ``cancelled``; a failure of
    ours (an unexpected exception) is counted as ``error`` before the route answers 500.
    """
    with accounted(request.state) as account, (await get_repository(request)).use(name, version) as model:
        account.model(model.name, model.version)
        arrived = model.batcher.clock.now()
        deadline = model.batcher.deadline(getattr(request.state, "requested_timeout", None))
        settings = state.settings
        body = await body_by_deadline(
            read_body(request, settings.max_body_bytes),
            deadline - model.batcher.clock.now(),
            request,
            settings.max_body_bytes,
        )
        parsed, parse_seconds = await _parsed(request, state, model, body, deadline)
        if parsed.timeout is not None:
            deadline = min(deadline, arrived + parsed.timeout)
        outcome = await unless_disconnected(
            request, infer_tensors(model, parsed, max_rows=settings.max_images_per_request, deadline=deadline)
        )
        content, headers = encode_infer_response(model.name, str(model.version), parsed.id, outcome.outputs)
    headers["Server-Timing"] = server_timing(
        decode=parse_seconds, queue=outcome.queue_seconds, compute=outcome.compute_seconds
    )
    return Response(content, media_type=headers.pop("Content-Type"), headers=headers)


@router.post(
    "/models/{name}/infer",
    summary="Inference on raw tensors (JSON or binary)",
    openapi_extra=INFER_BODY,
    responses=INFER_RESPONSES,
    dependencies=[Depends(requested_timeout)],
)
async def infer(name: str, request: Request, state: State, version: Version = None) -> Response:
    return await _infer(request, state, name, version)


@router.post(
    "/models/{name}/versions/{version}/infer",
    summary="Inference on one model version",
    openapi_extra=INFER_BODY,
    responses=INFER_RESPONSES,
    dependencies=[Depends(requested_timeout)],
)
async def infer_version(name: str, version: str, request: Request, state: State) -> Response:
    asked = request.query_params.get("version")
    same = asked is not None and asked.isdecimal() and version.isdecimal() and int(asked) == int(version)
    if asked is not None and not same:  # which one ran would otherwise be our silent choice (02 is 2)
        raise BadRequest(f"the path asks for version {version!r} and ?version= for {asked!r}; send one of them")
    return await _infer(request, state, name, version)


_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


@router.api_route("", methods=_ANY_METHOD, include_in_schema=False)
@router.api_route("/{path:path}", methods=_ANY_METHOD, include_in_schema=False)
@catch_all
async def unknown(request: Request) -> Response:
    """Every /v2 request no route took: 405 with ``Allow`` when the path exists, else 404.

    Starlette would answer a method the path lacks with the ``Allow`` of the first route that
    has the path (one of GET and HEAD, registered as two routes) as problem+json, and the
    catch-all would make PUT on an existing path a 404; here both are the protocol's error.
    """
    status, detail, headers = not_allowed(request.app.router.routes, request.scope)  # the repository's routes too
    return protocol_error_response(status, detail, headers or None)
