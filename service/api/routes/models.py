"""The models this server serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.deps import Repository
from service.api.openapi import problem_responses

router = APIRouter(prefix="/v1/models", tags=["models"])


def _describe(name: str, repository: Repository) -> dict[str, Any]:
    versions = repository.models[name]
    latest = versions[max(versions)]
    return {
        "name": name,
        "task": latest.manifest.task,
        "latest_version": str(latest.version),
        "versions": [versions[v].describe() for v in sorted(versions)],
    }


@router.get(
    "",
    summary="Every model: versions, task, input size, labels, provider in use, batching",
    responses=problem_responses(401, 503),
)
async def list_models(repository: Repository) -> dict[str, Any]:
    return {"models": [_describe(name, repository) for name in sorted(repository.models)]}


@router.get("/{name}", summary="One model", responses=problem_responses(401, 404, 422, 503))
async def get_model(name: str, repository: Repository) -> dict[str, Any]:
    repository.get(name)  # raises ModelNotFound (404) for an unknown name
    return _describe(name, repository)
