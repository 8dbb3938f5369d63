"""Request forms of vLLM's server, sent to the shared live server as clients written for vLLM send
them: several served model names, vLLM's own structured-outputs example (its requests, from
``fixtures/vllm_structured_outputs.py``, the script as vLLM ships it: a ``response_format``
structural tag among them), xgrammar's ``format`` form of that structural tag, and outlines' vLLM
client, whose JSON Schemas may carry a whitespace pattern. The same forms without the engine are in
test_vllm_fields.py."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Literal

import jsonschema
import openai
import outlines
import pytest
from fixtures.vllm_structured_outputs import PARAMS, CarDescription
from outlines.types import CFG, JsonSchema, Regex
from support.live_api import ALIASES, KEY, MODEL, Animal, validation

pytestmark = pytest.mark.engine

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}


def test_every_served_name_is_listed_and_answered(client: openai.OpenAI) -> None:
    """``--served-model-name MODEL ALIASES...``: one card per name, in that order; a request may
    name any of them, and the answer names the first, as vLLM's does."""
    assert [card.id for card in client.models.list()] == [MODEL, *ALIASES]
    for alias in ALIASES:
        assert client.models.retrieve(alias).id == alias
        reply = client.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
        )
        assert reply.model == MODEL and reply.choices[0].message.content


async def _answer(client: openai.AsyncOpenAI, model: str, name: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """The example's request for constraint ``name``, as its ``cli()`` sends it; the answer's
    content and validation (a stream's joined)."""
    reply = await client.chat.completions.create(model=model, max_tokens=1024, stream=stream, **PARAMS[name])
    if not stream:
        return reply.choices[0].message.content or "", validation(reply.choices[0])
    text, verdict = "", {}
    async for chunk in reply:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            verdict = (choice.model_extra or {}).get("validation") or verdict
    return text, verdict


def _calls_of_their_schema(text: str) -> bool:
    """Whether each complete ``<function=get_weather>...</function>`` call in ``text`` is JSON of
    its structure's schema (an error otherwise); the text around them is free."""
    for body in text.split("<function=get_weather>")[1:]:
        if "</function>" in body:
            jsonschema.validate(json.loads(body.split("</function>")[0]), CITY)
    return True


#: What each of the example's answers must be: of its constraint.
EXAMPLE_CHECKS = {
    "choice": lambda text: text in ("positive", "negative"),
    "regex": lambda text: re.fullmatch(r"[a-z0-9.]{1,20}@\w{6,10}\.com\n", text),
    "json": CarDescription.model_validate_json,
    "grammar": lambda text: re.fullmatch(r"SELECT col_[12]  from table_[12]  where col_[12] = [12] ", text),
    "structural_tag": _calls_of_their_schema,
}


async def test_vllms_structured_outputs_example_is_answered_in_every_constraint(server: str) -> None:
    """Every request of vLLM's example as its ``cli()`` sends them (the first listed model,
    ``max_tokens`` 1024, all at once), whole and streamed (both runs at once: one batch for the
    engine). Each answer is of its constraint and accepted; only the structural tag's free text may
    run to the token limit. The client's timeout guards against a hang; it is no figure."""
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)
    model = (await client.models.list()).data[0].id
    runs = [(name, stream) for stream in (False, True) for name in PARAMS]
    answers = await asyncio.gather(*(_answer(client, model, name, stream) for name, stream in runs))
    for (name, stream), (text, verdict) in zip(runs, answers, strict=True):
        run = f"{name}, {'streamed' if stream else 'whole'}: {text!r}"
        assert verdict["status"] == "accepted" or (name == "structural_tag" and verdict["status"] == "truncated"), run
        assert EXAMPLE_CHECKS[name](text), run


def test_a_structural_tag_response_format_in_xgrammars_format_form(client: openai.OpenAI) -> None:
    """The example's other form: one tag and nothing else, its content JSON of its schema."""
    tag = {
        "type": "tag",
        "begin": "<point>",
        "content": {"type": "json_schema", "json_schema": POINT},
        "end": "</point>",
    }
    choice = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write the point (2, 3) as <point>JSON</point>."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "structural_tag", "format": tag},
    ).choices[0]
    text = choice.message.content or ""
    assert choice.finish_reason == "stop" and validation(choice)["status"] == "accepted", choice
    assert text.startswith("<point>") and text.endswith("</point>"), text
    jsonschema.validate(json.loads(text.removeprefix("<point>").removesuffix("</point>")), POINT)


# ---------------------------------------------------------------- outlines' vLLM client

TRIP = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
COLOR = 'start: "The sky is " COLOR "."\nCOLOR: "blue" | "grey" | "red"'
INTEGER = r"[+-]?(0|[1-9][0-9]*)"
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


def _whitespace_outside_strings(text: str) -> set[str]:
    return set(re.findall(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)))


def _laid_out_trip(text: str) -> bool:
    """Whether the trip ``text`` (of ``TRIP``, else an error) has only the pattern's whitespace."""
    jsonschema.validate(json.loads(text), TRIP)
    return _whitespace_outside_strings(text) <= {"\n", " "}


#: (output type, prompt, max_tokens, check of the text), one per kind of output type outlines sends.
OUTLINES_CASES: dict[str, tuple[Any, str, int, Any]] = {
    "pydantic": (Animal, "Describe a cat as JSON.", 40, Animal.model_validate_json),
    "literal": (Literal["yes", "no"], "Is the sky blue? Answer yes or no.", 4, lambda text: text in ("yes", "no")),
    "int": (int, "How many legs has a dog?", 8, lambda text: re.fullmatch(INTEGER, text)),
    "regex": (Regex(DATE), "Today's date:", 16, lambda text: re.fullmatch(DATE, text)),
    "cfg": (
        CFG(COLOR),
        "What colour is the sky?",
        12,
        lambda text: re.fullmatch(r"The sky is (blue|grey|red)\.", text),
    ),
    "whitespace": (JsonSchema(TRIP, whitespace_pattern=r"[\n ]{0,2}"), "A trip as JSON:", 60, _laid_out_trip),
}


@pytest.fixture(scope="module")
def outlines_model(server: str) -> Any:
    """outlines' client on the shared server, by one of its other names."""
    return outlines.from_vllm(
        openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120), ALIASES[1]
    )


@pytest.mark.parametrize("case", OUTLINES_CASES)
def test_outlines_vllm_client_gets_valid_outputs(outlines_model: Any, case: str) -> None:
    """outlines sends a ``structured_outputs`` regex, grammar or JSON Schema (with its
    ``whitespace_pattern``, which llguidance honours here: only its whitespace outside strings)."""
    output_type, prompt, max_tokens, check = OUTLINES_CASES[case]
    text = outlines_model(prompt, output_type, max_tokens=max_tokens, temperature=0)
    assert check(text), text


def test_outlines_vllm_client_streams_a_valid_output(outlines_model: Any) -> None:
    text = "".join(outlines_model.stream("Describe a cat as JSON.", Animal, max_tokens=40, temperature=0))
    Animal.model_validate_json(text)


async def test_outlines_async_vllm_client_gets_a_valid_output(server: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
    model = outlines.from_vllm(client, MODEL)
    text = await model(
        "A trip as JSON:", JsonSchema(TRIP, whitespace_pattern=r"[\n ]{0,2}"), max_tokens=60, temperature=0
    )
    assert _laid_out_trip(text), text
