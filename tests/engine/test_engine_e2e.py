"""End to end on the real engine: vLLM (CPU) with the embedded SmolLM2-135M-Instruct.

Every shape kind, the logits-chain order (grammar mask first), the verdict statuses, the four ways a
generation stops, logprobs after the mask, streaming, and bad input refused before the engine.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Annotated

import pytest
from pydantic import BaseModel, ConfigDict, Field
from support.closed_parts import parts_of

from tokenmold.grammar import Shape
from tokenmold.grammar.errors import GrammarSyntaxError, RegexError, SchemaError
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import VerdictStatus
from tokenmold.service.bench.e2e import TOOL_CALL_SCHEMA
from tokenmold.service.errors import BudgetTooSmall
from tokenmold.service.request.runtime import Prompt
from tokenmold.service.tokenmold import Tokenmold

pytestmark = pytest.mark.engine

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["engineer", "scientist", "artist"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
ASK = Prompt.user("Describe Ada Lovelace, a 36 year old scientist, as JSON with name, age and role.")


class Animal(BaseModel):
    # extra="forbid" puts additionalProperties: false in the schema; without it the schema as
    # written allows extra keys, and a 135M model happily keeps inventing them.
    model_config = ConfigDict(extra="forbid")

    species: str = Field(max_length=20)
    legs: int = Field(ge=0, le=8)


async def _one(rt, prompt, shape, **sampling):
    result = await rt.generate(prompt, shape, SamplingOptions(**sampling))
    return result.completions[0]


async def test_every_shape_kind_is_accepted(engine_runtime) -> None:
    rt = engine_runtime
    json_out = await _one(rt, ASK, Shape.from_json_schema(PERSON), max_tokens=80, temperature=0)
    assert json_out.verdict.status is VerdictStatus.ACCEPTED, json_out.verdict
    assert set(json_out.verdict.value) == {"name", "age", "role"}

    animal = await _one(
        rt, Prompt.user("Give me an animal as JSON."), Shape.from_pydantic(Animal), max_tokens=60, temperature=0
    )
    assert animal.verdict.status is VerdictStatus.ACCEPTED, animal.verdict
    Animal.model_validate(animal.verdict.value)

    ebnf = 'root ::= "The answer is " digit+ "."\ndigit ::= [0-9]'
    math_out = await _one(rt, Prompt.user("What is 6 times 7?"), Shape.from_ebnf(ebnf), max_tokens=12, temperature=0)
    assert math_out.verdict.status is VerdictStatus.ACCEPTED, math_out.verdict
    assert math_out.verdict.text.startswith("The answer is ")

    date = await _one(
        rt,
        Prompt.user("When did World War 2 end?"),
        Shape.from_regex(r"\d{4}-\d{2}-\d{2}"),
        max_tokens=12,
        temperature=0,
    )
    assert date.verdict.status is VerdictStatus.ACCEPTED, date.verdict
    assert len(date.verdict.text) == 10

    choice = await _one(
        rt,
        Prompt.user("Is the sky blue? Answer yes or no."),
        Shape.from_choice(["yes", "no"]),
        max_tokens=5,
        temperature=0,
    )
    assert choice.verdict.status is VerdictStatus.ACCEPTED and choice.verdict.text in {"yes", "no"}


async def test_grammar_mask_comes_before_logit_bias(engine_runtime) -> None:
    rt = engine_runtime
    tokenizer = rt.engine.tokenizer
    hello = tokenizer.encode("Hello", add_special_tokens=False)[0]
    bias = {hello: 100.0}
    # Control: without a grammar the +100 bias wins every step.
    free = await _one(rt, ASK, None, max_tokens=4, temperature=0, logit_bias=bias)
    assert free.token_ids.count(hello) == 4
    # With a grammar that forbids the token, the mask (applied first) removes it before the bias.
    constrained = await _one(rt, ASK, Shape.from_choice(["yes", "no"]), max_tokens=4, temperature=0, logit_bias=bias)
    assert hello not in constrained.token_ids
    assert constrained.verdict.status is VerdictStatus.ACCEPTED


async def test_hot_sampling_stays_valid(engine_runtime) -> None:
    shape = Shape.from_json_schema(
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "count": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["color", "count"],
            "additionalProperties": False,
        }
    )
    result = await engine_runtime.generate(
        Prompt.user("Pick a color and a count."),
        shape,
        SamplingOptions(max_tokens=40, temperature=2.0, top_p=1.0, seed=7, n=4),
    )
    assert len(result.completions) == 4
    for completion in result.completions:
        assert completion.verdict.status is VerdictStatus.ACCEPTED, completion.verdict


async def test_greedy_and_seeded_sampling_are_valid_and_reproducible(engine_runtime) -> None:
    shape = Shape.from_json_schema(PERSON)
    greedy = [await _one(engine_runtime, ASK, shape, max_tokens=80, temperature=0) for _ in range(2)]
    seeded = [await _one(engine_runtime, ASK, shape, max_tokens=80, temperature=0.8, seed=1234) for _ in range(2)]
    for c in greedy + seeded:
        assert c.verdict.status is VerdictStatus.ACCEPTED, c.verdict
    assert greedy[0].verdict.text == greedy[1].verdict.text
    assert seeded[0].verdict.text == seeded[1].verdict.text


async def test_max_tokens_is_truncated_never_accepted(engine_runtime) -> None:
    # A budget above the schema's shortest output (5 tokens) and far below the answer's length.
    story = Shape.from_json_schema(
        {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    )
    out = await _one(engine_runtime, Prompt.user("Tell a long story about a dragon, as JSON."), story, max_tokens=9)
    assert out.verdict.status is VerdictStatus.TRUNCATED
    assert out.verdict.finish_reason == "length" and out.verdict.value is None
    assert out.verdict.usage.completion_tokens == 9


async def test_a_budget_below_the_shortest_output_is_refused_before_decoding(engine_runtime) -> None:
    many = {"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 200}
    with pytest.raises(BudgetTooSmall) as exc:
        await _one(engine_runtime, ASK, Shape.from_json_schema(many), max_tokens=20)
    assert exc.value.param == "max_tokens"
    assert "max_tokens=20 cannot hold the shortest output this schema allows" in exc.value.message
    # Without max_tokens the context's room is the budget, and it is named as such.
    with pytest.raises(BudgetTooSmall, match="tokens the context leaves"):
        await _one(engine_runtime, ASK, Shape.from_json_schema({**many, "minItems": 2000}))


async def test_context_full_ends_as_length(engine_runtime) -> None:
    rt = engine_runtime
    filler = " ".join(["word"] * 2000)
    ids = rt.engine.tokenizer.encode(filler, add_special_tokens=False)[: rt.engine.max_model_len - 4]
    text = rt.engine.tokenizer.decode(ids)
    out = await _one(rt, Prompt(text=text), None, temperature=0, ignore_eos=True)
    assert out.verdict.finish_reason == "length"
    assert out.verdict.status is VerdictStatus.TRUNCATED
    assert out.verdict.usage.total_tokens <= rt.engine.max_model_len


async def test_stop_string_is_matched_on_text_and_removed(engine_runtime) -> None:
    out = await _one(
        engine_runtime, Prompt.user("Write a sentence about the sea."), None, max_tokens=48, temperature=0, stop=[" "]
    )
    assert out.verdict.finish_reason == "stop" and out.verdict.stop_reason == " "
    assert " " not in out.verdict.text


async def test_all_end_of_sequence_ids_stop_the_generation(engine_runtime) -> None:
    rt = engine_runtime
    # The generation config lists <|im_end|> and <|endoftext|>; the chat template ends turns with the first.
    assert {rt.engine.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")} <= set(
        rt.engine.stop_token_ids
    )
    out = await _one(rt, Prompt.user("Say hi."), Shape.from_choice(["hi"]), max_tokens=8, temperature=0)
    assert out.verdict.status is VerdictStatus.ACCEPTED
    assert out.verdict.finish_reason == "stop" and not isinstance(out.verdict.stop_reason, str)


async def test_min_tokens_delays_the_stop(engine_runtime) -> None:
    out = await _one(engine_runtime, Prompt.user("Say hi."), None, max_tokens=30, min_tokens=20, temperature=0)
    assert out.verdict.usage.completion_tokens >= 20


async def test_logprobs_are_taken_after_the_grammar_mask(engine_runtime) -> None:
    rt = engine_runtime
    choices = ["yes", "no"]
    out = await _one(
        rt, Prompt.user("Is water wet?"), Shape.from_choice(choices), max_tokens=4, temperature=0, logprobs=5
    )
    assert out.logprobs, "logprobs were asked for"
    first = out.logprobs[0]
    finite = {tid: lp.logprob for tid, lp in first.items() if math.isfinite(lp.logprob)}
    assert finite
    for token_id in finite:
        piece = rt.engine.tokenizer.decode([token_id])
        assert any(c.startswith(piece) for c in choices), f"masked-out token {piece!r} has a finite logprob"
    # After the mask the legal tokens carry all the probability mass.
    assert math.isclose(sum(math.exp(v) for v in finite.values()), 1.0, abs_tol=0.05)


async def test_streaming_reassembles_and_ends_with_the_verdict(engine_runtime) -> None:
    deltas = [
        d
        async for d in engine_runtime.stream(
            ASK, Shape.from_json_schema(PERSON), SamplingOptions(max_tokens=80, temperature=0)
        )
    ]
    assert len(deltas) > 1
    assert all(d.verdict is None for d in deltas[:-1]) and deltas[-1].verdict is not None
    text = "".join(d.text for d in deltas)
    assert deltas[-1].verdict.text == text
    assert deltas[-1].verdict.status is VerdictStatus.ACCEPTED
    json.loads(text)


async def test_forced_prefix_is_taken_as_prompt_and_returned_as_output(engine_runtime) -> None:
    """Jump-forward: the tokens the grammar forces are prefilled, not decoded, and the caller gets
    them back as output (ids, text, usage, logprobs) on both paths; without the jump the same
    request decodes them one by one."""
    rt = engine_runtime
    ask = Prompt.user("What is the weather in Paris? Call the tool.")
    shape = Shape.from_json_schema(TOOL_CALL_SCHEMA)
    forced = list((await rt.compile(shape)).engine_spec.forced_tokens)
    assert rt.engine.tokenizer.decode(forced) == '{"name":"get_weather","arguments":{"city'
    out = await _one(rt, ask, shape, max_tokens=40, temperature=0, logprobs=1)
    assert out.verdict.status is VerdictStatus.ACCEPTED, out.verdict
    assert out.verdict.value["name"] == "get_weather"
    assert out.token_ids[: len(forced)] == forced
    assert out.verdict.usage.completion_tokens == len(out.token_ids)
    assert len(out.logprobs) == len(out.token_ids)
    assert [step[t].logprob for step, t in zip(out.logprobs, forced, strict=False)] == [0.0] * len(forced)
    deltas = [d async for d in rt.stream(ask, shape, SamplingOptions(max_tokens=40, temperature=0))]
    assert deltas[0].token_ids[: len(forced)] == forced
    assert "".join(d.text for d in deltas) == out.verdict.text
    assert deltas[-1].verdict.usage.completion_tokens == len(out.token_ids)
    rt.jump_forward = False
    try:
        plain = await _one(rt, ask, shape, max_tokens=40, temperature=0)
    finally:
        rt.jump_forward = True
    assert plain.verdict.status is VerdictStatus.ACCEPTED, plain.verdict
    # A budget the prefix would fill cannot hold any complete output: refused before decoding.
    with pytest.raises(BudgetTooSmall, match=f"max_tokens={len(forced)} cannot hold"):
        await _one(rt, ask, shape, max_tokens=len(forced), temperature=0)


@pytest.mark.parametrize(
    "shape, error",
    [
        (lambda: Shape.from_json_schema('{"type": "object", "properties": '), SchemaError),
        (lambda: Shape.from_regex("(unclosed"), RegexError),
        (lambda: Shape.from_ebnf("root ::= missing_rule"), GrammarSyntaxError),
    ],
)
async def test_bad_input_is_a_typed_error_before_the_engine(engine_runtime, shape, error) -> None:
    with pytest.raises(error) as exc:
        await engine_runtime.generate(ASK, shape(), SamplingOptions(max_tokens=8))
    assert str(exc.value)


EMAIL = {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}
#: Inside the email string the grammar allows any text; this bias makes the model write "ohn" for ever.
LOOP_BIAS = {2102: 100.0}


async def test_a_looping_output_is_stopped_early_by_the_repetition_guard(engine_runtime) -> None:
    prompt = Prompt.user("Give John's email address as JSON.")
    # Greedy: sampled, the string's first token is sometimes '""', which closes it at once.
    loop = {"max_tokens": 400, "logit_bias": LOOP_BIAS, "temperature": 0}
    out = await _one(engine_runtime, prompt, Shape.from_json_schema(EMAIL), **loop)
    verdict = out.verdict
    assert verdict.status is VerdictStatus.TRUNCATED and verdict.value is None
    assert (verdict.finish_reason, verdict.stop_reason) == ("length", "repetition")
    assert [(e.path, e.keyword) for e in verdict.errors] == [("/email", "repetition")]
    assert "ohnohnohn" in verdict.text and verdict.text.startswith("{")
    assert verdict.usage.completion_tokens < 100  # not the 400 the loop would have taken
    deltas = [d async for d in engine_runtime.stream(prompt, Shape.from_json_schema(EMAIL), SamplingOptions(**loop))]
    assert deltas[-1].verdict is not None and deltas[-1].verdict.stop_reason == "repetition"
    assert deltas[-1].verdict.usage.completion_tokens < 100
    assert all(d.verdict is None for d in deltas[:-1])


class Author(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=20)
    born: int = Field(ge=1000, le=2030)


class Book(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=30)
    author: Author
    tags: list[Annotated[str, Field(max_length=12)]] = Field(min_length=2, max_length=3)


async def test_the_python_iterator_fills_a_model_in_as_its_fields_close(engine_runtime) -> None:
    # A Tokenmold around the session's started runtime (its own would start a second engine); its
    # calls run on this event loop, where vLLM's output handler lives, from a worker thread.
    tm = object.__new__(Tokenmold)
    tm.runtime, tm._loop = engine_runtime, asyncio.get_running_loop()
    ask = "Describe the novel Dune as JSON: title, author (name, born) and tags."
    steps = await asyncio.to_thread(
        lambda: list(tm.stream(ask, Shape.from_pydantic(Book), max_tokens=120, temperature=0))
    )
    verdict = steps[-1].verdict
    assert verdict is not None and verdict.status is VerdictStatus.ACCEPTED, verdict
    parts = [part for step in steps for part in step.partials]
    assert [(part.pointer, part.value) for part in parts] == list(parts_of(verdict.value).items())
    filled = [step.model.model_fields_set for step in steps]
    assert all(a <= b for a, b in zip(filled, filled[1:], strict=False)) and filled[0] == {"title"}
    assert steps[-1].model == Book.model_validate(verdict.value)
    assert isinstance(next(s.model.author for s in steps if "author" in s.model.model_fields_set), Author)

    # Leaving the loop early aborts the generation.
    aborted = engine_runtime.aborted

    def first_step() -> None:
        steps = tm.stream(ask, Shape.from_pydantic(Book), max_tokens=120, temperature=0)
        next(steps)
        steps.close()

    await asyncio.to_thread(first_step)
    assert engine_runtime.aborted == aborted + 1
