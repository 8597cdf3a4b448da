"""OpenAPI declarations shared by the routes: problem+json responses and the results wrapper.

Each task's own result schema lives with the task (``service.tasks``, ``Task.result_schema``).

Every status a route can answer is declared with its media type, so the document can be
checked against the server (``tests/service/http/test_openapi.py`` runs schemathesis on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from service.core.errors import PROBLEM_MEDIA_TYPE

# examples/digit-7.png box-resized to the model's 8x8, as PNG: a body the docs can send as is.
DIGIT_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAAAAADhZOFXAAAAQklEQVR42i3KQRGAIBAAwB0SXARsQAQi2MAKNjGCUbABEaxAg/Pjv"
    "hd15gXGOLMh3ia7Ym1xq2Dmn/YZFBzPApEdH8G3EcZgEYNZAAAAAElFTkSuQmCC"
)

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "urn:patchserve:problem:<slug>"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string", "description": "What went wrong and what to do."},
        "instance": {"type": "string", "description": "The request id (X-Request-ID)."},
    },
}

_WHEN = {
    400: "Malformed request: empty body, bad multipart or JSON, no image, too many images or parts",
    401: "Missing or wrong API key (only when PATCHSERVE_API_KEYS is set)",
    404: "Unknown model or version",
    408: "The body was not received in time",
    413: "Body or image too large (decompression bombs included)",
    415: "Not a decodable image, or a content type that carries none",
    422: "Invalid query parameters",
    500: "The model run failed (a fault of the server, never of the input)",
    503: "Not ready, draining, or the queue is full; retry after Retry-After seconds",
    504: "The request's deadline passed while it was queued",
}
_HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    503: {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying"}},
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for ``statuses``, each an ``application/problem+json`` body."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {
            "description": _WHEN[status],
            "content": {PROBLEM_MEDIA_TYPE: {"schema": PROBLEM_SCHEMA}},
        }
        if status in _HEADERS:
            response["headers"] = _HEADERS[status]
        responses[status] = response
    return responses


# ?render=png (or Accept: image/png): the image with its detections drawn.
PNG_CONTENT: dict[str, Any] = {"image/png": {"schema": {"type": "string", "format": "binary"}}}


def image_responses(result_schema: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """The responses of an inference route whose one-image body is ``result_schema``.

    Several images answer 200 with ``{"results": [...]}``, each a result or a problem.
    """
    several = {
        "title": "Results",
        "type": "object",
        "required": ["results"],
        "properties": {"results": {"type": "array", "items": {"anyOf": [result_schema, PROBLEM_SCHEMA]}}},
    }
    ok = {
        "description": "One image: its result. Several: {results: [...]} in input order, each a result or a problem.",
        "content": {"application/json": {"schema": {"anyOf": [result_schema, several]}}},
    }
    return {200: ok, **problem_responses(400, 401, 404, 408, 413, 415, 422, 500, 503, 504)}


SECURITY_SCHEME = "apiKey"


def declare_bearer(app: FastAPI, public_paths: frozenset[str]) -> None:
    """Make the OpenAPI document say which operations need the bearer key (Swagger's Authorize)."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
            "type": "http",
            "scheme": "bearer",
            "description": "One of the keys in PATCHSERVE_API_KEYS.",
        }
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                operation["security"] = [] if path in public_paths else [{SECURITY_SCHEME: []}]
                if path not in public_paths:
                    operation.setdefault("responses", {}).setdefault("401", problem_responses(401)[401])
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
