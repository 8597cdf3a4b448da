"""OpenAPI declarations of the Open Inference Protocol routes: bodies, and every status they answer.

Every error, the routes' own and those of the middleware in front of them (401 without a valid
API key, 503 when the worker is full), is the protocol's ``{"error": "..."}`` (``application/json``).
"""

from __future__ import annotations

from typing import Any

from service.v2.protocol import BYTES, DATATYPES, HEADER_LENGTH

ERROR_SCHEMA: dict[str, Any] = {
    "title": "ProtocolError",
    "description": "The Open Inference Protocol's error object.",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_DATATYPE = {"type": "string", "enum": [*DATATYPES, BYTES]}
_SHAPE = {"type": "array", "items": {"type": "integer"}, "description": "-1: any size"}
_METADATA_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {"name": {"type": "string"}, "datatype": _DATATYPE, "shape": _SHAPE},
}
SERVER_METADATA_SCHEMA: dict[str, Any] = {
    "title": "ServerMetadata",
    "type": "object",
    "required": ["name", "version", "extensions"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}},
    },
}
MODEL_METADATA_SCHEMA: dict[str, Any] = {
    "title": "ModelMetadata",
    "type": "object",
    "required": ["name", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _METADATA_TENSOR},
        "outputs": {"type": "array", "items": _METADATA_TENSOR},
    },
}
LIVE_SCHEMA = {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}}
READY_SCHEMA = {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}}
CONFIG_SCHEMA: dict[str, Any] = {
    "title": "ModelConfig",
    "description": "Triton's model configuration (model_config.proto as JSON).",
    "type": "object",
    "required": ["name", "platform", "max_batch_size", "input", "output"],
}
INFER_RESPONSE_SCHEMA: dict[str, Any] = {
    "title": "InferenceResponse",
    "type": "object",
    "required": ["model_name", "outputs"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "datatype", "shape"],
                "properties": {
                    "name": {"type": "string"},
                    "datatype": _DATATYPE,
                    "shape": _SHAPE,
                    "data": {"type": "array", "description": "Row-major; absent when sent as binary"},
                    "parameters": {"type": "object"},
                },
            },
        },
    },
}
_INFER_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": _DATATYPE,
        "parameters": {"type": "object", "description": "binary_data_size: bytes of this tensor after the JSON"},
        "data": {"type": "array", "description": "Row-major, flat or nested"},
    },
}
INFER_BODY: dict[str, Any] = {
    "parameters": [
        {
            "name": HEADER_LENGTH,
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 1},
            "description": "Length of the JSON object when binary tensor data follows it",
        }
    ],
    "requestBody": {
        "required": True,
        "description": "An inference request JSON object, optionally followed by binary tensor data "
        f"(then {HEADER_LENGTH} gives the JSON object's length).",
        "content": {
            "application/json": {
                "schema": {
                    "title": "InferenceRequest",
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": {"type": "object"},
                        "inputs": {"type": "array", "items": _INFER_TENSOR},
                        "outputs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
                            },
                        },
                    },
                }
            },
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
}

_WHEN = {
    400: "Malformed request, a tensor that does not fit the model, or (health) not ready",
    401: "Missing or wrong API key (only when PATCHSERVE_API_KEYS is set)",
    403: "The model control API is off (the default; PATCHSERVE_MODEL_CONTROL_API=true turns it on)",
    404: "Unknown model or version",
    408: "The body was not received in time",
    413: "Body too large (decompressed included)",
    415: "A Content-Encoding other than gzip, deflate or identity",
    500: "The model run failed (a fault of the server, never of the input)",
    503: "Models still loading, the queue is full, or the worker is full; retry after Retry-After seconds",
    504: "The request's deadline passed while it was queued",
}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying"}}


def v2_responses(ok_schema: dict[str, Any], *statuses: int, binary: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses``: 200 with ``ok_schema`` (and binary tensors), 401 and 503 always, and ``statuses``."""
    ok: dict[str, Any] = {"application/json": {"schema": ok_schema}}
    if binary:
        ok["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "Success", "content": ok},
        401: {
            "description": _WHEN[401],
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
            "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
        },
        503: {
            "description": _WHEN[503],
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
            "headers": _RETRY_AFTER,
        },
    }
    for status in statuses:
        responses[status] = {"description": _WHEN[status], "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    return responses
