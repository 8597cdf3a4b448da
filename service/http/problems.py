"""The one mapping of domain errors to responses: ``application/problem+json`` (RFC 9457), or ``{"error"}`` on /v2.

Core code raises the exceptions of :mod:`service.core.errors`; :func:`install_handlers` turns
them (and FastAPI's own validation and HTTP errors) into problem responses in one place.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.core.errors import PROBLEM_MEDIA_TYPE, InvalidParameter, ProblemError, release_frames, shorten_detail
from service.http import accounting
from service.http.methods import not_allowed

log = logging.getLogger(__name__)


def request_id(request: Request) -> str | None:
    """The request's id as set by the request-id middleware (None outside a request)."""
    return getattr(request.state, "request_id", None)


def problem_response(error: ProblemError, instance: str | None = None) -> JSONResponse:
    """A ``JSONResponse`` carrying ``error`` as problem+json, with its headers."""
    return JSONResponse(
        error.to_problem(instance), status_code=error.status, headers=error.headers, media_type=PROBLEM_MEDIA_TYPE
    )


PROTOCOL_PREFIX = "/v2"  # the Open Inference Protocol's routes answer errors as {"error": "..."}


def is_protocol_path(path: str) -> bool:
    """True for ``/v2`` and the paths under it, whose errors are the protocol's ``{"error": ...}``."""
    return path == PROTOCOL_PREFIX or path.startswith(PROTOCOL_PREFIX + "/")


def protocol_error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The Open Inference Protocol's error: ``{"error": message}`` with ``status`` (what tritonclient reads)."""
    return JSONResponse({"error": shorten_detail(message)}, status_code=status, headers=headers)


def error_response_for(path: str, error: ProblemError, instance: str | None = None) -> JSONResponse:
    """``error`` in the format of the API ``path`` belongs to: ``{"error"}`` on /v2, else problem+json.

    Middleware that answers before any route runs (API keys, admission) uses it, so a 401 or a
    503 on a /v2 path reads as the protocol says, as every error of its routes does.
    """
    if is_protocol_path(path):
        return protocol_error_response(error.status, error.detail, error.headers)
    return problem_response(error, instance)


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "header"))
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts) or "invalid request"


def count_refused_inference(request: Request) -> None:
    """Count a refusal of an inference route's parameters (before its handler ran) as ``client_error``.

    Labelled as :func:`~service.http.accounting.inference_labels` reads the path and query (the
    version asked for, else the default; ``_unknown`` for a model that does not exist: a
    client's arbitrary name never becomes a label). Other paths are not counted.
    """
    labels = accounting.inference_labels(request.scope)
    if labels is not None and request.method == "POST":
        accounting.count_refused(labels, "client_error")


def unexpected(exc: BaseException, where: str) -> ProblemError:
    """The last-resort answer to a bug of ours: logs ``exc`` with its traceback, returns a bare 500.

    Every path that catches an unexpected exception (the error handlers, the request-id
    middleware, the v2 routes) answers with this, so no internals leak to the client.

    Args:
        exc: the exception caught.
        where: what was being served, for the log line (e.g. the request id or the path).
    """
    log.error("unhandled error in %s", where, exc_info=exc)
    return ProblemError("an unexpected server error; see the server log")


def install_handlers(app: FastAPI) -> None:
    """Map domain errors, validation errors and HTTP errors to problem+json on ``app``."""

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        release_frames(exc)
        return error_response_for(request.url.path, exc, request_id(request))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        count_refused_inference(request)
        release_frames(exc)
        return error_response_for(request.url.path, InvalidParameter(_validation_detail(exc)), request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status, detail, headers = exc.status_code, str(exc.detail), dict(exc.headers or {})
        if status == 405:  # every route of the path, not the first one's (service/http/methods.py)
            status, detail, headers = not_allowed(request.app.router.routes, request.scope)
        error = ProblemError(detail, headers=headers)
        error.status, error.slug = status, f"http-{status}"
        error.title = {404: "Not found", 405: "Method not allowed"}.get(status, "HTTP error")
        release_frames(exc)  # as every answered error's: nothing of the request outlives its answer
        return error_response_for(request.url.path, error, request_id(request))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        error = unexpected(exc, f"request {request_id(request)}")
        release_frames(exc)  # (logged with its traceback first)
        return error_response_for(request.url.path, error, request_id(request))
