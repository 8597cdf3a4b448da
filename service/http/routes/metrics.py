"""``GET /metrics``: Prometheus text exposition format, merged across worker processes."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.core.metrics import exposition

router = APIRouter(tags=["metrics"])


# Two routes, so that GET and HEAD have distinct operationIds (see routes/health.py).
@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
@router.head("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)
