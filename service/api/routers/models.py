"""GET /v1/models and /v1/models/{id}: the one model this server serves, under each of its names
(``ServerSettings.model_names``; vLLM lists one card per served name too)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from tokenmold.schemas.openai import ModelCard, ModelList
from tokenmold.service.api.deps import get_generation
from tokenmold.service.api.errors import ERROR_RESPONSES
from tokenmold.service.api.generation import Generation

router = APIRouter()


def _card(generation: Generation, name: str) -> ModelCard:
    return ModelCard(
        id=name,
        created=int(generation.started),
        max_model_len=generation.runtime.engine.max_model_len,
        dtype=generation.runtime.engine.dtype,
    )


@router.get("/v1/models")
async def list_models(generation: Generation = Depends(get_generation)) -> ModelList:
    return ModelList(data=[_card(generation, name) for name in generation.settings.model_names])


@router.get("/v1/models/{model_id:path}", responses={404: ERROR_RESPONSES[404]})
async def get_model(model_id: str, generation: Generation = Depends(get_generation)) -> ModelCard:
    generation.check_model(model_id)
    return _card(generation, model_id)
