"""The Open Inference Protocol's model repository extension, as Triton implements it.

``POST /v2/repository/index`` lists every model in the repository folder or served, one entry per
version with its state (``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``) and the reason
when it is not ready; ``POST /v2/repository/models/{name}/load`` loads the model's folder as it
is now (the versions its policy selects; a ``config`` parameter may carry a ``version_policy``
that holds until the next load or unload) and answers once they serve, or 400 with why they
failed, while the other models go on serving; ``.../unload`` stops serving every version of it
and answers at once, each version finishing its queued and in-flight requests before its
sessions are released. tritonclient's ``get_model_repository_index``, ``load_model`` and
``unload_model`` drive them unchanged. Load and unload sit behind the API keys when they are set
and answer 403 unless ``PATCHSERVE_MODEL_CONTROL_API`` is true (off by default, as Triton's model
control mode is none). Errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from service.core.codings import content_coding, shown
from service.core.errors import BadRequest, Forbidden, Unavailable, UnsupportedMediaType
from service.core.json_bounds import CONTROL_CONTAINERS, check_containers
from service.http.deps import State
from service.http.routes.v2 import ProtocolRoute
from service.http.uploads import read_body
from service.runtime.model_control import ModelControl
from service.runtime.version_policy import ConfigError, once_each_key, parse_config
from service.v2.openapi import v2_responses

router = APIRouter(prefix="/v2/repository", tags=["open inference protocol (v2)"], route_class=ProtocolRoute)

INDEX_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string", "description": "empty when no version of the model is known"},
            "state": {"type": "string", "enum": ["READY", "LOADING", "UNLOADING", "UNAVAILABLE"]},
            "reason": {"type": "string"},
        },
    },
}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object"}


async def _read_body(request: Request, state: State) -> bytes:
    """The request's body, at most the body cap; a compressed one is refused (415), never read as JSON."""
    encoding = content_coding(request.headers.getlist("content-encoding"))
    if encoding is not None:
        raise UnsupportedMediaType(
            f"Content-Encoding {shown(encoding)}: the repository API takes its small JSON bodies as they "
            "are (only infer takes gzip or deflate)"
        )
    return await read_body(request, state.settings.max_body_bytes)


def _json(body: bytes) -> Any:
    """The body as JSON; a key given twice in one object is refused, as in a load's config (json.loads
    lets the last win: ``{"parameters": {"config": …}, "parameters": {}}`` loaded without the config).

    Raises:
        BadRequest: not JSON, or a key given twice (400).
    """
    try:
        return json.loads(body, object_pairs_hook=once_each_key)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    except ValueError as exc:  # once_each_key's
        raise BadRequest(f"the body has {exc}") from None


async def _parameters(request: Request, state: State) -> dict[str, Any]:
    """The request body's ``parameters`` object ({} for an empty body).

    Raises:
        BadRequest: a body that is not a JSON object (or gives a key twice), or ``parameters`` that is not one.
    """
    body = await _read_body(request, state)
    if not body.strip():
        return {}
    check_containers(body, CONTROL_CONTAINERS, 'the body is {"parameters": {...}}')
    data = _json(body)
    parameters = data.get("parameters", {}) if isinstance(data, dict) else None
    if not isinstance(parameters, dict):
        raise BadRequest('the body must be a JSON object such as {"parameters": {"config": "{...}"}}')
    return parameters


def _control(state: State) -> ModelControl:
    """The server's model control (create_app always sets one; a bare ServerState of a test has none)."""
    assert state.control is not None
    return state.control


def _control_allowed(state: State) -> None:
    """Raises Forbidden (403) when the API is off, Unavailable (503) until start-up has loaded the models."""
    if not state.settings.model_control_api:
        raise Forbidden(
            "the model control API is off on this server; PATCHSERVE_MODEL_CONTROL_API=true serves load and unload "
            "(Triton's --model-control-mode=explicit)"
        )
    if state.repository is None:
        raise Unavailable(state.startup_error or "the models are still loading", retry_after=2)


@router.post(
    "/index",
    summary="Every model and version in the repository, with its state",
    responses=v2_responses(INDEX_SCHEMA, 400),
)
async def index(request: Request, state: State) -> list[dict[str, str]]:
    body = await _read_body(request, state)
    ready_only = False
    if body.strip():
        check_containers(body, CONTROL_CONTAINERS, 'the body is {"ready": true} or empty')
        data = _json(body)
        if not isinstance(data, dict) or not isinstance(data.get("ready", False), bool):
            raise BadRequest('the body must be a JSON object such as {"ready": true}')
        ready_only = data.get("ready", False)
    entries = _control(state).index()
    return [e for e in entries if e["state"] == "READY"] if ready_only else entries


@router.post(
    "/models/{name}/load",
    summary="Load a model's versions as its folder holds them now (Triton's load)",
    responses=v2_responses(EMPTY_SCHEMA, 400, 403),
)
async def load(name: str, request: Request, state: State) -> dict[str, Any]:
    _control_allowed(state)
    parameters = await _parameters(request, state)
    files = [key for key in parameters if key.startswith("file:")]
    if files:
        raise BadRequest(
            f"model files in the request ({', '.join(files)}) are not taken: publish them in the repository"
        )
    if unknown := sorted(set(parameters) - {"config"}):  # Triton's load takes config and files only
        raise BadRequest(f"unknown load parameter(s) {', '.join(map(repr, unknown))}; load takes config")
    policy = None
    if "config" in parameters:
        if not isinstance(parameters["config"], str):
            raise BadRequest("parameters.config must be a string holding the model configuration as JSON")
        try:
            policy = parse_config(parameters["config"], "parameters.config", loading=name).version_policy
        except ConfigError as exc:
            raise BadRequest(str(exc)) from None
    await _control(state).load(name, policy)
    return {}


@router.post(
    "/models/{name}/unload",
    summary="Stop serving every version of a model; each finishes its requests first (Triton's unload)",
    responses=v2_responses(EMPTY_SCHEMA, 400, 403),
)
async def unload(name: str, request: Request, state: State) -> dict[str, Any]:
    _control_allowed(state)
    await _parameters(request, state)  # unload_dependents: no model here depends on another
    await _control(state).unload(name)
    return {}
