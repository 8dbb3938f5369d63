"""OpenAI's batch formats: the input and result lines of a batch file, and the ``/v1/files`` and
``/v1/batches`` objects, with the field names and values OpenAI's SDK reads.

A result line is OpenAI's: ``{id, custom_id, response: {status_code, request_id, body}, error}``.
A request that got an HTTP answer (200, or a 4xx such as a bad schema) has ``response`` and
``error: null``; a line that never reached a route (unknown url, not POST, ``stream: true``) has
``response: null`` and ``error: {code, message, line}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------- batch file lines


class BatchRequestLine(BaseModel):
    """One line of an input file. Unknown envelope fields are refused, like unknown body fields."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1, max_length=512)
    method: str
    url: str
    body: dict[str, Any]


class BatchResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchLineError(BaseModel):
    code: str
    message: str
    #: The line of the input file (1-based).
    line: int | None = None


class BatchResultLine(BaseModel):
    id: str
    custom_id: str
    response: BatchResponse | None = None
    error: BatchLineError | None = None


# ---------------------------------------------------------------- /v1/files

FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    expires_at: int | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


# ---------------------------------------------------------------- /v1/batches

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    #: Accepted for OpenAI compatibility; output files are kept until deleted.
    output_expires_after: dict[str, Any] | None = None


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchLineError] = Field(default_factory=list)


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts)
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
