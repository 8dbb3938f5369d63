"""What the HTTP end-to-end modules share: the shared server's model name, key and limits
(``servers.py`` holds every server's flags), and the shapes they send."""

from __future__ import annotations

import enum
import re
import time
from typing import NamedTuple

import httpx
import openai
from pydantic import BaseModel, ConfigDict, EmailStr, Field, HttpUrl

from tokenmold.service.engine.model_home import default_model_dir

KEY = "sk-tokenmold-test"
MODEL = "SmolLM2-135M-Instruct"
#: The shared server's other names (``--served-model-name MODEL ALIASES...``, as vLLM takes several).
ALIASES = ("gpt-4o-2024-08-06", "gpt-5")
#: The body limit: above the adversarial corpus's largest legitimate body (a 100,000-value enum).
MAX_BODY = 4_000_000
#: The compile limit: past every shape the tests expect to compile (128 tools take ~0.1 s), short
#: enough that the slow-compile test's request is stopped at it.
COMPILE_TIMEOUT_S = 5


#: vLLM engine arguments the shared server runs with, as a vLLM command line spells them
#: (``test_api_engine_flags.py`` checks they reach the engine): prefix caching, a smaller
#: prefill chunk than vLLM's CPU default (2048), and the model's own chat template given as a
#: file, so that nothing else changes.
ENGINE_FLAGS = (
    "--enable-prefix-caching",
    "--max-num-batched-tokens", "1024",
    "--chat-template", str(default_model_dir() / "chat_template.jinja"),
)  # fmt: skip


#: A member record whose ``status`` is an enum (the grammar forces the rest of a member once one
#: has begun): what the drafting tests send and draft.
MEMBER = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"enum": ["active_member", "former_member"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "status", "tags"],
    "additionalProperties": False,
}


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


def validation(choice) -> dict:
    return choice.model_extra["validation"]


def finished_batch(client: openai.OpenAI, batch_id: str, timeout_s: float = 300) -> openai.types.Batch:
    """The batch once it has finished (completed, failed or cancelled), polled every half second."""
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)


class PrefixUse(NamedTuple):
    """What vLLM's metrics say of two chats that share a long system message."""

    #: vLLM's ``cache_config_info`` says so (``None``: the server shows no such line).
    enabled: bool | None
    prompt_tokens: list[int]
    queried: float
    hits: float


def prefix_cache_use(server: str, client: openai.OpenAI, rules: int = 120) -> PrefixUse:
    """Send two chats whose system message (``rules`` rules, ~10 tokens each) they share, and read
    from ``/metrics`` how many prompt tokens asked vLLM's prefix cache and how many it served."""
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer in plain words." for i in range(rules))

    def metrics() -> str:
        return httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text

    def counter(text: str, name: str) -> float:
        return sum(float(value) for value in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))

    before = metrics()
    prompts = []
    for question in ("What is two plus two?", "Name a color."):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
        )
        assert reply.usage is not None
        prompts.append(reply.usage.prompt_tokens)
    after = metrics()
    info = re.search(r'^vllm:cache_config_info\{[^}]*enable_prefix_caching="(\w+)"', after, re.M)
    enabled = None if info is None else info.group(1) == "True"
    queried, hits = (
        counter(after, name) - counter(before, name)
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    )
    return PrefixUse(enabled, prompts, queried, hits)


#: Tool parameters as pydantic writes them, with ``$ref``s into their own ``$defs``.
class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str = Field(max_length=20)


class Forecast(BaseModel):
    """A nested model and an enum: both ``$ref``s into ``$defs``."""

    place: Place
    unit: Unit


class Node(BaseModel):
    """A recursive model: the parameters' root is itself a ``$ref`` into ``$defs``."""

    value: int
    children: list[Node] = []
