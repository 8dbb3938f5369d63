"""Request bodies written for vLLM's OpenAI server, without the engine: each is answered as vLLM
answers it, or better where vLLM would ignore what was asked (``service/api/fields.py``). The live
server's answers to the same bodies are in test_vllm_parity.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tokenmold.grammar import ShapeKind
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest, ChatUsage, CompletionRequest
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api import errors
from tokenmold.service.api.translate import ChatStream, CompletionStream, chat_plan, completion_plan
from tokenmold.service.errors import RequestError, ShapeFieldError
from tokenmold.service.request.runtime import StreamDelta

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
USER = [{"role": "user", "content": "hi"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def refused(**fields) -> RequestError:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(**fields), MODEL)
    return exc.value


# ---------------------------------------------------------------- tools and tool_choice


@pytest.mark.parametrize(
    "constraint, param",
    [
        ({"structured_outputs": {"json": PARAMETERS}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": True}}, "structured_outputs.json_object"),
        ({"regex": "[a-z]+"}, "regex"),
    ],
)
def test_a_constraint_beside_a_named_tool_choice_is_refused(constraint: dict, param: str) -> None:
    """vLLM refuses structured outputs with a named tool_choice (check_structured_outputs_count);
    here the error names the field."""
    error = refused(tools=[TOOL], tool_choice=NAMED, **constraint)
    assert error.param == param and "named tool_choice" in error.message
    # The same constraint with tool_choice "none" is the output's shape: nothing else to meet.
    assert chat_plan(chat(tools=[TOOL], tool_choice="none", **constraint), MODEL).shape_param == param


def test_a_response_format_beside_a_named_tool_choice_leaves_the_call() -> None:
    """vLLM drops response_format for a named or required call (the tool parser's adjust_request);
    so does tokenmold: the format is for a later turn's answer (agent frameworks send both)."""
    format_ = {"type": "json_schema", "json_schema": {"name": "answer", "schema": PARAMETERS}}
    plan = chat_plan(chat(tools=[TOOL], tool_choice=NAMED, response_format=format_), MODEL)
    assert plan.tool_format is HERMES and plan.shape.source.required
    assert [tool.name for tool in plan.shape.source.tools] == ["get_weather"]


# ---------------------------------------------------------------- strict, and where errors point


@pytest.mark.parametrize(
    "tool, strict",
    [
        ({**TOOL, "strict": True}, True),
        ({**TOOL, "function": {**TOOL["function"], "strict": True}}, True),
        ({**TOOL, "strict": False, "function": {**TOOL["function"], "strict": False}}, False),
        ({**TOOL, "strict": True, "function": {**TOOL["function"], "strict": True}}, True),
        (TOOL, False),
    ],
)
def test_strict_is_read_beside_function_as_vllm_writes_it(tool: dict, strict: bool) -> None:
    plan = chat_plan(chat(tools=[tool], tool_choice="required"), MODEL)
    assert [t.strict for t in plan.shape.source.tools] == [strict]


def test_strict_given_twice_with_two_values_is_refused_where_it_contradicts() -> None:
    tool = {**TOOL, "strict": True, "function": {**TOOL["function"], "strict": False}}
    error = refused(tools=[TOOL, tool])
    assert error.param == "tools[1].strict"


@pytest.fixture(scope="module")
def client() -> TestClient:
    """The error mapper behind a route that takes a chat body and plans it."""
    app = FastAPI()
    errors.install(app)

    @app.post("/plan")
    async def plan(body: ChatCompletionRequest) -> dict[str, str | None]:
        return {"shape_param": chat_plan(body, MODEL).shape_param}

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{**TOOL, "function": {**TOOL["function"], "strict": [1]}}]}, "tools[0].function.strict"),
        ({"tools": [{**TOOL, "strict": "sometimes"}]}, "tools[0].strict"),
        ({"tools": [{**TOOL, "defer": True}]}, "tools[0].defer"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        (
            {"tools": [TOOL, {**TOOL, "strict": True, "function": {**TOOL["function"], "strict": False}}]},
            "tools[1].strict",
        ),
    ],
)
def test_an_error_names_the_field_as_the_request_spelled_it(client: TestClient, fields: dict, param: str) -> None:
    """Pydantic's locations carry each union member's label (the tag ``function`` of a tool, ``str``
    of a message's content): the error's ``param`` leaves them out."""
    response = client.post("/plan", json={"model": "m", "messages": USER, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


# ---------------------------------------------------------------- continuous usage in streams

PROMPT = 7


def piece(index: int, text: str, tokens: int, *, last: int | None = None) -> StreamDelta:
    """A delta of ``tokens`` tokens; ``last``: it ends the choice, whose output is ``last`` tokens."""
    verdict = None
    if last is not None:
        usage = Usage(prompt_tokens=PROMPT, completion_tokens=last, total_tokens=PROMPT + last)
        verdict = Verdict(status=VerdictStatus.ACCEPTED, finish_reason="stop", text=text, usage=usage)
    return StreamDelta(index, text, list(range(tokens)), verdict=verdict, prompt_tokens=PROMPT)


#: Two choices, interleaved; the second delta of choice 0 is held back (no text, no chunk).
DELTAS = [piece(0, "Hel", 2), piece(1, "Bye", 1), piece(0, "", 1), piece(0, "lo", 1, last=4), piece(1, "!", 2, last=3)]


def test_the_stream_options_vllm_sends_are_accepted() -> None:
    body = chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert body.stream_options is not None and body.stream_options.continuous_usage_stats


def test_continuous_usage_puts_each_choices_usage_so_far_in_every_chunk() -> None:
    """vLLM's serving_chat: the role chunk counts no tokens, every later chunk the prompt and that
    choice's tokens so far (held-back tokens included once a chunk goes out); the closing usage
    chunk is the total."""
    stream = ChatStream(chat_plan(chat(), MODEL), model="m", continuous_usage=True)
    chunks = [chunk for delta in DELTAS for chunk in stream.chunks(delta)]
    seen = [
        (c.choices[0].index, c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in chunks
    ]
    assert seen == [(0, 7, 0, 7), (0, 7, 2, 9), (1, 7, 0, 7), (1, 7, 1, 8), (0, 7, 4, 11), (1, 7, 3, 10)]
    assert stream.usage_chunk().usage == ChatUsage.of(7, 7)


def test_completion_streams_count_the_same_way() -> None:
    plan = completion_plan(CompletionRequest.model_validate({"model": "m", "prompt": "Q:"}), MODEL)
    stream = CompletionStream(plan, model="m", continuous_usage=True)
    chunks = [chunk for delta in DELTAS for chunk in stream.chunks(delta)]
    seen = [(c.choices[0].index, c.usage.completion_tokens) for c in chunks]
    assert seen == [(0, 2), (1, 1), (0, 4), (1, 3)]
    assert all(c.usage.prompt_tokens == PROMPT for c in chunks)


def test_without_continuous_usage_no_chunk_carries_usage() -> None:
    stream = ChatStream(chat_plan(chat(), MODEL), model="m")
    assert all(chunk.usage is None for delta in DELTAS for chunk in stream.chunks(delta))
    assert stream.usage_chunk().usage.completion_tokens == 7


# ---------------------------------------------------------------- guided_* fields


def completion(**fields) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Q:", **fields})


@pytest.mark.parametrize(
    "field, value, kind, source",
    [
        ("guided_json", PARAMETERS, ShapeKind.JSON_SCHEMA, PARAMETERS),
        ("guided_json", '{"type": "integer"}', ShapeKind.JSON_SCHEMA, {"type": "integer"}),
        ("guided_regex", "[0-9]+", ShapeKind.REGEX, "[0-9]+"),
        ("guided_choice", ["yes", "no"], ShapeKind.CHOICE, ("yes", "no")),
        ("guided_grammar", 'root ::= "a"', ShapeKind.EBNF, 'root ::= "a"'),
    ],
)
def test_guided_fields_are_the_structured_outputs_they_became(field: str, value: object, kind, source) -> None:
    """vLLM 0.32 ignores them (the output goes unconstrained, serve/engine/protocol.py); here each
    is the shape its structured_outputs field gives, on both routes, named by its own name."""
    same = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
    for plan in (chat_plan(chat(**{field: value}), MODEL), completion_plan(completion(**{field: value}), MODEL)):
        assert plan.shape.kind is kind and plan.shape.source == source and plan.shape_param == field
    twin = chat_plan(chat(structured_outputs={same[field]: value}), MODEL)
    assert (twin.shape.kind, twin.shape.source) == (kind, source)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"guided_json": PARAMETERS, "guided_regex": "a"}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a"}, "guided_grammar": 'root ::= "a"'}, "guided_grammar"),
        ({"guided_whitespace_pattern": "[ ]?", "guided_regex": "a"}, "guided_whitespace_pattern"),
        ({"tools": [TOOL], "tool_choice": NAMED, "guided_json": PARAMETERS}, "guided_json"),
    ],
)
def test_guided_fields_are_refused_where_their_twins_are(fields: dict, param: str) -> None:
    assert refused(**fields).param == param


def test_the_guided_decoding_backend_is_the_servers_choice() -> None:
    """Accepted (vLLM clients send it) and changes nothing: the shape is the same either way."""
    with_backend = chat_plan(chat(guided_regex="[0-9]+", guided_decoding_backend="outlines"), MODEL)
    assert with_backend == chat_plan(chat(guided_regex="[0-9]+"), MODEL)


# ---------------------------------------------------------------- response_format structural tags

POINT_TAG = {"begin": "<point>", "schema": PARAMETERS, "end": "</point>"}
STRUCTURAL_TAGS = [
    {"type": "structural_tag", "structures": [POINT_TAG], "triggers": ["<point>"]},
    {
        "type": "structural_tag",
        "format": {"type": "tag", "begin": "<point>", "content": {"type": "json_schema", "json_schema": PARAMETERS}},
    },
]


@pytest.mark.parametrize("tag", STRUCTURAL_TAGS, ids=["structures", "format"])
def test_a_structural_tag_response_format_is_the_structural_tag_vllm_makes_of_it(tag: dict) -> None:
    """vLLM reads the format as ``structured_outputs.structural_tag`` (the JSON text of its own
    models' dump): the same text gives the same shape here, on both routes, named ``response_format``."""
    from pydantic import TypeAdapter
    from vllm.entrypoints.generate.base.protocol import (
        AnyStructuralTagResponseFormat,
        structured_outputs_from_response_format,
    )

    vllm_format = TypeAdapter(AnyStructuralTagResponseFormat).validate_python(tag)
    as_vllm_reads_it = structured_outputs_from_response_format(None, vllm_format).structural_tag
    twin = chat_plan(chat(structured_outputs={"structural_tag": as_vllm_reads_it}), MODEL)
    for plan in (chat_plan(chat(response_format=tag), MODEL), completion_plan(completion(response_format=tag), MODEL)):
        assert plan.shape.kind is ShapeKind.STRUCTURAL_TAG and plan.shape_param == "response_format"
        assert plan.shape == twin.shape


@pytest.mark.parametrize(
    "tag",
    [
        {"type": "structural_tag"},
        {"type": "structural_tag", "structures": [POINT_TAG]},
        {"type": "structural_tag", "structures": [{"begin": "<point>", "end": "</point>"}], "triggers": ["<p"]},
    ],
    ids=["neither form", "no triggers", "no schema"],
)
def test_a_structural_tag_response_format_that_is_neither_form_is_refused_by_name(tag: dict) -> None:
    error = refused(response_format=tag)
    assert isinstance(error, ShapeFieldError) and error.code == "invalid_grammar" and error.param == "response_format"


# ---------------------------------------------------------------- whitespace_pattern


@pytest.mark.parametrize(
    "fields, shape_param",
    [
        ({"structured_outputs": {"json": PARAMETERS, "whitespace_pattern": r"[\n ]?"}}, "structured_outputs.json"),
        ({"guided_json": PARAMETERS, "guided_whitespace_pattern": r"[\n ]?"}, "guided_json"),
        (
            {
                "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": PARAMETERS}},
                "structured_outputs": {"whitespace_pattern": r"[\n ]?"},
            },
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_whitespace_pattern_lays_out_the_json_it_comes_with(fields: dict, shape_param: str) -> None:
    """vLLM 0.32 takes the field and ignores it; here it is llguidance's whitespace option, on
    both routes (outlines' vLLM client sends it with a ``JsonSchema``'s ``whitespace_pattern``)."""
    for plan in (chat_plan(chat(**fields), MODEL), completion_plan(completion(**fields), MODEL)):
        assert plan.shape.kind is ShapeKind.JSON_SCHEMA and plan.shape_param == shape_param
        assert plan.options.whitespace_pattern == r"[\n ]?"


PATTERN = {"json": PARAMETERS, "whitespace_pattern": " "}


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs", "not with"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "not without one"),
        ({"structured_outputs": PATTERN, "guided_whitespace_pattern": " "}, "guided", "once"),
        ({"structured_outputs": {**PATTERN, "disable_any_whitespace": True}}, "structured_outputs", "contradicts"),
        ({"structured_outputs": PATTERN, "budget": "fit"}, "structured_outputs", "budget: fit"),
        ({"structured_outputs": PATTERN, "tools": [TOOL]}, "structured_outputs", "tools"),
        ({"structured_outputs": {**PATTERN, "whitespace_pattern": "("}}, "structured_outputs", "unclosed group"),
    ],
)
def test_a_whitespace_pattern_is_refused_by_name_where_it_cannot_lay_json_out(
    fields: dict, param: str, words: str
) -> None:
    error = refused(**fields)
    whitespace = {"structured_outputs": "structured_outputs.whitespace_pattern", "guided": "guided_whitespace_pattern"}
    assert error.param == whitespace[param] and words in error.message, error.message
    # The same request without the pattern is planned.
    so = {name: value for name, value in fields["structured_outputs"].items() if name != "whitespace_pattern"}
    chat_plan(chat(**{**fields, "structured_outputs": so, "guided_whitespace_pattern": None}), MODEL)


# ---------------------------------------------------------------- several served model names


def test_the_served_model_name_flag_takes_several_names_as_vllms_does() -> None:
    from tokenmold.service.cli.main import _parser

    parser = _parser()
    names = ["SmolLM2-135M-Instruct", "gpt-4o-2024-08-06", "gpt-5"]
    assert parser.parse_args(["serve", "--served-model-name", *names]).served_model_name == names
    assert parser.parse_args(["ray", "serve", "--served-model-name", *names]).served_model_name == names
    assert parser.parse_args(["serve"]).served_model_name is None  # the model folder's name


def test_every_served_name_is_listed_first_name_first_and_accepted() -> None:
    from tokenmold.service.api.generation import Generation
    from tokenmold.service.api.routers.models import router
    from tokenmold.service.api.settings import ServerSettings

    app = FastAPI()
    errors.install(app)
    app.include_router(router)
    runtime = SimpleNamespace(engine=SimpleNamespace(max_model_len=8192, dtype="float32"))
    settings = ServerSettings(model_name="m", model_aliases=("gpt-4o-2024-08-06", "gpt-5"))
    app.state.generation = Generation(runtime, settings, metrics=None)  # type: ignore[arg-type]
    models = TestClient(app, raise_server_exceptions=False)
    assert [card["id"] for card in models.get("/v1/models").json()["data"]] == ["m", "gpt-4o-2024-08-06", "gpt-5"]
    assert models.get("/v1/models/gpt-5").json()["id"] == "gpt-5"
    missing = models.get("/v1/models/gpt-4o")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
