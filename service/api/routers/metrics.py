"""GET /metrics: Prometheus text format (see ``tokenmold.service.api.metrics`` for what is counted)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from tokenmold.service.api.deps import get_generation
from tokenmold.service.api.generation import Generation

router = APIRouter()


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(generation: Generation = Depends(get_generation)) -> Response:
    return Response(generation.metrics.render(), media_type=CONTENT_TYPE_LATEST)
