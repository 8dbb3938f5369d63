"""What the HTTP end-to-end modules share: one ``tokenmold serve`` per module (embedded SmolLM2-135M
on vLLM CPU, about half a minute to start), the openai client on it, and the shapes they send.

Modules take the fixtures by importing them (``from live_api import client, server``): a
module-scoped fixture imported into two modules is one server for each.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel, ConfigDict, EmailStr, Field, HttpUrl

from tokenmold.service.bench.live_server import LiveServer

KEY = "sk-tokenmold-test"
MODEL = "SmolLM2-135M-Instruct"
MAX_BODY = 100_000


class Animal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    species: str = Field(max_length=20)
    legs: int = Field(ge=0, le=8)


class GetWeather(BaseModel):
    """Current weather in a city."""

    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=20)


class Shortlist(BaseModel):
    """A bounded list as pydantic writes it (``maxItems``; llguidance's grammar leaves it out and
    the bound guard holds it)."""

    colors: list[str] = Field(max_length=2)


class Flight(BaseModel):
    """A counted pattern as pydantic writes it (``pattern``; llguidance's grammar leaves it out and
    the pattern guard holds it)."""

    code: str = Field(pattern=r"^[A-Z]{2}[0-9]{3,4}$")


class Contact(BaseModel):
    """Formats as pydantic writes them: ``HttpUrl`` is ``format: uri`` with ``maxLength: 2083``,
    ``EmailStr`` is ``format: email`` (llguidance's grammar leaves both out and the pattern guard
    runs llguidance's own expressions for them)."""

    website: HttpUrl
    email: EmailStr


WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a city",
            "parameters": WEATHER_PARAMS,
            "strict": True,
        },
    },
]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def slow_regex(classes: int, tag: str = "") -> str:
    """A regex whose xgrammar compile takes seconds: about 1.8 s of mask precomputation per
    ``[^c]{1,255}`` with a different excluded character (measured on 2 cores; the same class
    repeated costs it once, which made an earlier version of this helper finish before the
    tests' concurrent requests did). ``tag`` makes the shape new to the cache."""
    return "-".join(f"[^{c}]{{1,255}}" for c in "abcdefghij"[:classes]) + tag


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """``tokenmold serve`` in its own process group; every process of the group is gone afterwards."""
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with LiveServer(
        "--api-key",
        KEY,
        "--max-model-len",
        "1024",
        "--compile-timeout",
        "1",
        "--compile-workers",
        "2",
        "--max-body-bytes",
        str(MAX_BODY),
        "--log-level",
        "warning",
        log=log,
    ) as live:
        yield live.url
    assert not live.left_processes_behind, "the server left processes behind"


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


def validation(choice) -> dict:
    return choice.model_extra["validation"]
