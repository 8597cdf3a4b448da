"""The models this server serves, and the versions it does not serve now (loading, unloading, failed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.core.errors import ModelNotFound
from service.http.deps import Repository, State
from service.http.openapi import problem_responses

router = APIRouter(prefix="/v1/models", tags=["models"])


def _not_serving(state: State, name: str) -> list[dict[str, str]]:
    """The model's versions that are loading, unloading or unavailable, each with its state and reason.

    As in the repository index (:meth:`~service.runtime.model_control.ModelControl.not_serving`): a
    serving version whose files were rewritten and failed is ``READY`` here with that reason (it is
    under ``versions`` too).
    """
    versions = state.control.not_serving(name) if state.control is not None else {}
    return [{"version": str(v), "state": s.state, "reason": s.reason} for v, s in versions.items()]


def _policy(state: State, name: str) -> dict[str, Any] | None:
    try:
        return state.control.policy(name).describe() if state.control is not None else None
    except Exception as exc:  # an invalid config.json: shown, not served
        return {"error": str(exc)}


def _describe(name: str, repository: Repository, state: State) -> dict[str, Any]:
    versions = repository.models[name]
    latest = versions[max(versions)]
    return {
        "name": name,
        "task": latest.manifest.task,
        "latest_version": str(latest.version),  # what a request without a version gets
        "version_policy": _policy(state, name),
        "versions": [versions[v].describe() for v in sorted(versions)],
        "not_serving": _not_serving(state, name),
    }


@router.get(
    "",
    summary="Every model: versions, task, input size, labels, provider in use, batching; versions not serving",
    responses=problem_responses(401, 503),
)
async def list_models(repository: Repository, state: State) -> dict[str, Any]:
    """The models serving (``models``) and every version not serving now, of any model (``not_serving``)."""
    states = state.control.states if state.control is not None else {}
    return {
        "models": [_describe(name, repository, state) for name in sorted(repository.models)],
        "not_serving": [{"name": name, **entry} for name in sorted(states) for entry in _not_serving(state, name)],
    }


@router.get("/{name}", summary="One model", responses=problem_responses(401, 404, 422, 503))
async def get_model(name: str, repository: Repository, state: State) -> dict[str, Any]:
    if name not in repository.models:
        not_serving = _not_serving(state, name)
        if not not_serving:
            raise ModelNotFound(f"no model named {name!r}; GET /v1/models lists them")
        return {"name": name, "version_policy": _policy(state, name), "versions": [], "not_serving": not_serving}
    return _describe(name, repository, state)
