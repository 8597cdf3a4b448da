"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter

from service.core.errors import Unavailable
from service.http.deps import State
from service.http.openapi import problem_responses

router = APIRouter(tags=["health"])


_READY_SUMMARY = "Readiness: 200 once every model is loaded and warmed up; 503 before and while draining"


# GET and HEAD are two routes, not one api_route(methods=["GET", "HEAD"]): one route gives both
# operations the same operationId, which OpenAPI forbids (and FastAPI warns about).
@router.get("/healthz", summary="Liveness: 200 while the process serves")
@router.head("/healthz", summary="Liveness: 200 while the process serves")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary=_READY_SUMMARY, responses=problem_responses(503))
@router.head("/readyz", summary=_READY_SUMMARY, responses=problem_responses(503))
async def readyz(state: State) -> dict[str, str]:
    reasons = state.not_ready_reasons()
    if reasons:
        raise Unavailable("not ready: " + "; ".join(reasons), retry_after=1)
    return {"status": "ready"}
