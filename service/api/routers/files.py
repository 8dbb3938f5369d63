"""/v1/files: upload a batch input file, read it back, list and delete files (OpenAI's API).

A batch's results appear here too (purpose ``batch_output``) once it finishes.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse

from tokenmold.schemas.batch import FileDeleted, FileList, FileObject
from tokenmold.service.api.errors import ERROR_RESPONSES
from tokenmold.service.batch.store import FileStore

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {status: ERROR_RESPONSES[status] for status in (400, 404, 413)}


def get_files(request: Request) -> FileStore:
    store: FileStore = request.app.state.batches.files
    return store


@router.post("/v1/files", responses=_ERRORS)
async def upload_file(
    file: Annotated[UploadFile, File(description="the JSONL batch input")],
    purpose: Annotated[Literal["batch"], Form(description="only 'batch' files are stored here")],
    files: FileStore = Depends(get_files),
) -> FileObject:
    # Off the event loop: a large upload is copied and fsynced while other requests are served.
    return await asyncio.to_thread(files.create, file.file, filename=file.filename or "input.jsonl", purpose=purpose)


@router.get("/v1/files", responses=_ERRORS)
async def list_files(
    purpose: str | None = None,
    limit: int = Query(10_000, ge=1, le=10_000),
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
    files: FileStore = Depends(get_files),
) -> FileList:
    return files.list(purpose=purpose, limit=limit, after=after, order=order)


@router.get("/v1/files/{file_id}", responses=_ERRORS)
async def retrieve_file(file_id: str, files: FileStore = Depends(get_files)) -> FileObject:
    return files.get(file_id)


@router.get(
    "/v1/files/{file_id}/content",
    response_class=FileResponse,
    responses={200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}}, **_ERRORS},
)
async def file_content(file_id: str, files: FileStore = Depends(get_files)) -> FileResponse:
    return FileResponse(files.content_path(file_id), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}", responses=_ERRORS)
async def delete_file(file_id: str, files: FileStore = Depends(get_files)) -> FileDeleted:
    return files.delete(file_id)
