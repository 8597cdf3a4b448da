"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter

from service.core.errors import Unavailable
from service.http.deps import State
from service.http.openapi import problem_responses

router = APIRouter(tags=["health"])


@router.api_route("/healthz", methods=["GET", "HEAD"], summary="Liveness: 200 while the process serves")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.api_route(
    "/readyz",
    methods=["GET", "HEAD"],
    summary="Readiness: 200 once every model is loaded and warmed up; 503 before and while draining",
    responses=problem_responses(503),
)
async def readyz(state: State) -> dict[str, str]:
    reasons = state.not_ready_reasons()
    if reasons:
        raise Unavailable("not ready: " + "; ".join(reasons), retry_after=1)
    return {"status": "ready"}
