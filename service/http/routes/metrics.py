"""``GET /metrics``: Prometheus text exposition format, merged across worker processes."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.core.metrics import exposition

router = APIRouter(tags=["metrics"])


@router.api_route("/metrics", methods=["GET", "HEAD"], summary="Prometheus metrics", response_class=Response)
async def metrics() -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)
