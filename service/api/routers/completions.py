"""POST /v1/completions: a raw text prompt, no chat template."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tokenmold.schemas.openai import CompletionRequest, TextCompletion
from tokenmold.service.api.deps import get_generation
from tokenmold.service.api.errors import ERROR_RESPONSES, STREAM_CONTENT
from tokenmold.service.api.generation import Generation
from tokenmold.service.api.translate import CompletionStream, completion_plan, completion_response

router = APIRouter()


@router.post(
    "/v1/completions",
    response_model=None,
    responses={200: {"model": TextCompletion, **STREAM_CONTENT}, **ERROR_RESPONSES},
)
async def completions(
    body: CompletionRequest, request: Request, generation: Generation = Depends(get_generation)
) -> Response:
    plan = completion_plan(body, generation.runtime.model)
    return await generation.respond(request, body, plan, streamer=CompletionStream, answer=completion_response)
