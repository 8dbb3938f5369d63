"""GET /openapi.json: the API's OpenAPI document, behind the API key like every route but /health.

FastAPI's own document route cannot take dependencies, so it is switched off and served here; the
document is what API fuzzers (schemathesis, in the test suite) and client generators read.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/openapi.json", include_in_schema=False)
async def openapi_document(request: Request) -> dict[str, Any]:
    return request.app.openapi()
