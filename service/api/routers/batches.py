"""/v1/batches: create, retrieve, list and cancel batches (OpenAI's API); they run in the
background in this server (``service/batch/manager.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from tokenmold.schemas.batch import BatchCreateRequest, BatchList, BatchObject
from tokenmold.schemas.openai import ErrorBody
from tokenmold.service.api.errors import ERROR_RESPONSES
from tokenmold.service.batch.manager import BatchManager

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {status: ERROR_RESPONSES[status] for status in (400, 404)}


def get_batches(request: Request) -> BatchManager:
    manager: BatchManager = request.app.state.batches
    return manager


@router.post("/v1/batches", responses=_ERRORS)
async def create_batch(body: BatchCreateRequest, batches: BatchManager = Depends(get_batches)) -> BatchObject:
    return batches.create(body)


@router.get("/v1/batches", responses=_ERRORS)
async def list_batches(
    limit: int = Query(20, ge=1, le=100), after: str | None = None, batches: BatchManager = Depends(get_batches)
) -> BatchList:
    return batches.list(limit=limit, after=after)


@router.get("/v1/batches/{batch_id}", responses=_ERRORS)
async def retrieve_batch(batch_id: str, batches: BatchManager = Depends(get_batches)) -> BatchObject:
    return batches.get(batch_id)


@router.post(
    "/v1/batches/{batch_id}/cancel",
    responses={**_ERRORS, 409: {"model": ErrorBody, "description": "the batch is not running"}},
)
async def cancel_batch(batch_id: str, batches: BatchManager = Depends(get_batches)) -> BatchObject:
    return batches.cancel(batch_id)
