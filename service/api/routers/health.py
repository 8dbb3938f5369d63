"""GET /health: 200 only while the engine is alive (a load balancer's signal); no API key."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from tokenmold.service.api.deps import get_runtime
from tokenmold.service.api.errors import ERROR_RESPONSES
from tokenmold.service.errors import EngineUnavailable
from tokenmold.service.request.runtime import Runtime

router = APIRouter()


@router.get(
    "/health",
    response_class=Response,
    responses={200: {"description": "the engine is alive (empty body)", "content": {}}, 503: ERROR_RESPONSES[503]},
)
async def health(runtime: Runtime = Depends(get_runtime)) -> Response:
    if not await runtime.engine.is_healthy():
        raise EngineUnavailable("the engine does not answer its health check")
    return Response(status_code=200)
