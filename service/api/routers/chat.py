"""POST /v1/chat/completions: messages through the model's chat template."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tokenmold.schemas.openai import ChatCompletion, ChatCompletionRequest
from tokenmold.service.api.deps import get_generation
from tokenmold.service.api.errors import ERROR_RESPONSES, STREAM_CONTENT
from tokenmold.service.api.generation import Generation
from tokenmold.service.api.translate import ChatStream, chat_plan, chat_response

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletion, **STREAM_CONTENT}, **ERROR_RESPONSES},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, generation: Generation = Depends(get_generation)
) -> Response:
    plan = chat_plan(body, generation.runtime.model)
    return await generation.respond(request, body, plan, streamer=ChatStream, answer=chat_response)
