"""The HTTP layer without the engine: OpenAI bodies to plans, results and stream deltas to OpenAI
responses and chunks, the reasoning split, the error mapper, the body limit and the API key."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pydantic
import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from tokenmold.grammar import ShapeKind
from tokenmold.grammar.errors import CompileTimeout, LimitExceeded, SchemaError
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest, CompletionRequest, StreamOptions
from tokenmold.schemas.verdict import Usage, Verdict, VerdictError, VerdictStatus
from tokenmold.service.api import errors
from tokenmold.service.api.body import BodyLimit
from tokenmold.service.api.deps import REJECT_HEADER, reject_unaccepted, require_api_key
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.api.translate import (
    ChatStream,
    CompletionStream,
    chat_plan,
    chat_response,
    completion_plan,
    completion_response,
    unaccepted,
)
from tokenmold.service.errors import EngineUnavailable, ModelNotFound, PromptTooLong, RequestError, Unaccepted
from tokenmold.service.request.reasoning import ReasoningMarkers
from tokenmold.service.request.runtime import Completion, GenerationResult, StreamDelta

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def verdict(
    text: str, status: VerdictStatus = VerdictStatus.ACCEPTED, finish_reason: str = "stop", tokens: int = 3
) -> Verdict:
    errors_ = (
        [] if status is VerdictStatus.ACCEPTED else [VerdictError(path="", keyword="finish_reason", message="cut off")]
    )
    return Verdict(
        status=status,
        finish_reason=finish_reason,
        text=text,
        errors=errors_,
        usage=Usage(prompt_tokens=5, completion_tokens=tokens, total_tokens=5 + tokens),
    )


def lp(logprob: float, rank: int, token: str) -> SimpleNamespace:
    """Stands in for vllm.logprobs.Logprob."""
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=token)


# ---------------------------------------------------------------- requests -> plans


def test_response_formats_become_shapes() -> None:
    plan = chat_plan(
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}),
        MODEL,
    )
    assert plan.shape.kind is ShapeKind.JSON_SCHEMA and plan.shape.source == SCHEMA
    assert plan.options.strict and plan.shape_param == "response_format.json_schema.schema"
    plan = chat_plan(chat(response_format={"type": "json_object"}), MODEL)
    assert plan.shape.source == {"type": "object"} and not plan.options.strict
    assert chat_plan(chat(response_format={"type": "text"}), MODEL).shape is None
    assert chat_plan(chat(), MODEL).shape is None


@pytest.mark.parametrize(
    "field, value, kind",
    [
        ("grammar", 'root ::= "a"', ShapeKind.EBNF),
        ("regex", "[0-9]+", ShapeKind.REGEX),
        ("choice", ["yes", "no"], ShapeKind.CHOICE),
    ],
)
def test_extensions_become_shapes(field, value, kind) -> None:
    plan = chat_plan(chat(**{field: value}), MODEL)
    assert plan.shape.kind is kind and plan.shape_param == field
    plan = completion_plan(CompletionRequest.model_validate({"model": "m", "prompt": "Q:", field: value}), MODEL)
    assert plan.shape.kind is kind and plan.prompt.text == "Q:"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"regex": "a", "choice": ["a"]}, "choice"),
        (
            {"regex": "a+", "tools": [{"type": "function", "function": {"name": "f"}}]},
            "regex",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"hello": 1}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
        ),
    ],
)
def test_conflicting_or_bad_requests_are_refused_with_the_field(fields, param) -> None:
    with pytest.raises(RequestError) as exc:
        chat_plan(chat(**fields), MODEL)
    assert exc.value.param == param


def test_sampling_fields_map_onto_sampling_options() -> None:
    plan = chat_plan(
        chat(
            max_tokens=10,
            max_completion_tokens=7,
            temperature=0,
            top_p=0.5,
            top_k=4,
            min_p=0.1,
            seed=3,
            stop="END",
            logit_bias={"42": -100},
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.1,
            n=2,
            min_tokens=1,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=3,
        ),
        MODEL,
    )
    s = plan.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (7, 0, 0.5, 4, 0.1, 3)
    assert (s.stop, s.logit_bias, s.n, s.min_tokens, s.ignore_eos, s.logprobs) == (["END"], {42: -100}, 2, 1, True, 3)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, 0.25, 1.1)
    assert chat_plan(chat(logprobs=True), MODEL).sampling.logprobs == 0
    assert chat_plan(chat(), MODEL).sampling.logprobs is None
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        chat_plan(chat(temperature=3), MODEL)


def test_unknown_fields_and_several_prompts_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="response_fromat"):
        chat(response_fromat={"type": "json_object"})
    with pytest.raises(RequestError, match="one prompt per request"):
        completion_plan(CompletionRequest(model="m", prompt=["a", "b"]), MODEL)


def test_tools_plan_builds_the_tool_shape_and_the_prompt() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    plan = chat_plan(chat(tools=tools, tool_choice="required", parallel_tool_calls=False), MODEL)
    assert (
        plan.tool_format is HERMES
        and plan.shape_param == "tools"
        and plan.shape.source.required
        and not plan.shape.source.parallel
    )
    assert "get_weather" in plan.prompt.messages[0]["content"] and plan.prompt.tools is None
    assert chat_plan(chat(tools=tools), MODEL).shape.source.required is False  # auto by default
    none = chat_plan(chat(tools=tools, tool_choice="none"), MODEL)
    assert none.shape is None and none.prompt.messages == USER


# ---------------------------------------------------------------- results -> responses


def test_chat_response_carries_validation_and_the_engines_finish_reason() -> None:
    plan = chat_plan(chat(response_format={"type": "json_object"}), MODEL)
    result = GenerationResult(
        [
            Completion(0, verdict('{"a": 1}'), [1, 2, 3]),
            Completion(1, verdict('{"a"', VerdictStatus.TRUNCATED, "length"), [1]),
        ],
        compiled=None,
        prompt_tokens=5,
    )
    body = chat_response(result, plan, model="m").model_dump(mode="json")
    first, second = body["choices"]
    assert first["message"] == {
        "role": "assistant",
        "content": '{"a": 1}',
        "refusal": None,
        "tool_calls": None,
        "reasoning_content": None,
        "reasoning": None,
    }
    assert first["finish_reason"] == "stop" and first["validation"]["status"] == "accepted"
    assert second["finish_reason"] == "length" and second["validation"]["errors"][0]["keyword"] == "finish_reason"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")


def test_logprobs_leave_out_what_the_grammar_masked() -> None:
    plan = chat_plan(chat(logprobs=True, top_logprobs=3), MODEL)
    alternatives = {7: lp(-0.1, 1, "yes"), 8: lp(-2.4, 2, "no"), 9: lp(-math.inf, 3, "maybe")}
    result = GenerationResult([Completion(0, verdict("yes"), [7], [alternatives])], None, 5)
    (entry,) = chat_response(result, plan, model="m").choices[0].logprobs.content
    assert (entry.token, entry.logprob, entry.bytes) == ("yes", -0.1, list(b"yes"))
    assert [t.token for t in entry.top_logprobs] == ["yes", "no"]
    json.dumps(chat_response(result, plan, model="m").model_dump(mode="json"), allow_nan=False)
    legacy = completion_response(
        result, completion_plan(CompletionRequest(model="m", prompt="x", logprobs=1), MODEL), model="m"
    )
    assert legacy.choices[0].logprobs.tokens == ["yes"] and legacy.choices[0].logprobs.top_logprobs == [{"yes": -0.1}]


def test_tool_answers_become_tool_calls() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    plan = chat_plan(chat(tools=tools, tool_choice="required"), MODEL)
    result = GenerationResult(
        [Completion(0, verdict('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'), [1])], None, 5
    )
    choice = chat_response(result, plan, model="m").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.arguments == '{"a": 1}'


def test_unaccepted_lists_only_the_failed_choices() -> None:
    rejected = unaccepted([(0, verdict("ok")), (1, verdict("{", VerdictStatus.TRUNCATED, "length"))], fit=False)
    assert [(v.index, v.status) for v in rejected] == [(1, VerdictStatus.TRUNCATED)]


def test_a_fitted_output_passes_only_a_request_that_asked_for_fitting() -> None:
    fitted = [(0, verdict("{}", VerdictStatus.FITTED, "stop"))]
    assert unaccepted(fitted, fit=True) == []
    assert [v.status for v in unaccepted(fitted, fit=False)] == [VerdictStatus.FITTED]


# ---------------------------------------------------------------- streams


def test_chat_stream_opens_with_the_role_and_ends_with_the_verdict() -> None:
    stream = ChatStream(chat_plan(chat(), MODEL), model="m")
    chunks = [
        c
        for d in (StreamDelta(0, "Hel", [1]), StreamDelta(0, "lo", [2], verdict=verdict("Hello")))
        for c in stream.chunks(d)
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "stop"]
    assert chunks[-1].choices[0].validation.status is VerdictStatus.ACCEPTED
    assert all(c.id == chunks[0].id for c in chunks)
    usage = stream.usage_chunk()
    assert usage.choices == [] and usage.usage.total_tokens == 8


def _stream_pieces(plan_fields: dict, pieces: list[str], finish_reason: str = "stop") -> list:
    """The chunks a ChatStream makes of ``pieces`` (the last delta carries the verdict)."""
    stream = ChatStream(chat_plan(chat(**plan_fields), MODEL), model="m")
    text = "".join(pieces)
    deltas = [StreamDelta(0, piece, [i]) for i, piece in enumerate(pieces[:-1])]
    status = VerdictStatus.ACCEPTED if finish_reason == "stop" else VerdictStatus.TRUNCATED
    deltas.append(StreamDelta(0, pieces[-1], [len(pieces)], verdict=verdict(text, status, finish_reason)))
    return [c for d in deltas for c in stream.chunks(d)]


def test_chat_stream_sends_text_then_each_call_as_name_and_argument_fragments() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 12}}\n</tool_call>'
    text = f"Let me see. {call}\n{call.replace('12', '3')}"
    # The second call begins as the first one did: the repeated-call guard would hold it back until
    # it differs; off, it streams fragment by fragment like the first.
    body = {"tools": tools, "repeated_call_guard": False}
    chunks = _stream_pieces(body, [text[i : i + 3] for i in range(0, len(text), 3)])
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "Let me see."
    # no content chunk ever carries a piece of a tag
    assert not any("<" in (c.choices[0].delta.content or "") for c in chunks)
    pieces = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert [(p.index, p.function.name) for p in pieces if p.id] == [(0, "f"), (1, "f")]
    assert all(p.id is None and p.function.name is None for p in pieces if not p.id)
    for index in (0, 1):
        fragments = [p.function.arguments for p in pieces if p.index == index and p.function.arguments]
        assert len(fragments) >= 3
        assert json.loads("".join(fragments)) == {"a": 12 if index == 0 else 3}
    last = chunks[-1].choices[0]
    assert last.finish_reason == "tool_calls" and last.validation.status is VerdictStatus.ACCEPTED
    # sparse deltas: a later fragment says nothing about id/type/name (a client merges every key)
    later = next(p for p in pieces if not p.id).model_dump()
    assert later == {"index": later["index"], "function": {"arguments": later["function"]["arguments"]}}


def test_chat_stream_never_finishes_a_cut_call_as_a_call() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1'
    chunks = _stream_pieces({"tools": tools, "tool_choice": "required"}, [text[:15], text[15:]], "length")
    last = chunks[-1].choices[0]
    assert last.finish_reason == "length" and last.validation.status is VerdictStatus.TRUNCATED


def test_chat_stream_text_answer_with_tools_streams_as_it_comes() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    chunks = _stream_pieces({"tools": tools}, ["It is", " sunny <", "b>.\n"])
    contents = [c.choices[0].delta.content for c in chunks]
    assert contents[1] == "It is"  # streamed before the answer ended
    assert "".join(c or "" for c in contents) == "It is sunny <b>."
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_stream_keeps_text_offsets_per_choice() -> None:
    stream = CompletionStream(completion_plan(CompletionRequest(model="m", prompt="x", logprobs=0), MODEL), model="m")
    first = stream.chunks(StreamDelta(0, "ab", [1, 2], [{1: lp(-1, 1, "a")}, {2: lp(-1, 1, "b")}]))
    second = stream.chunks(StreamDelta(0, "c", [3], [{3: lp(-1, 1, "c")}], verdict=verdict("abc")))
    assert first[0].choices[0].logprobs.text_offset == [0, 1]
    assert second[0].choices[0].logprobs.text_offset == [2]
    assert second[0].choices[0].finish_reason == "stop"
    assert stream.chunks(StreamDelta(1, "", [])) == []


# ---------------------------------------------------------------- reasoning


REASONED = '<think>\nThe user wants JSON.\n</think>\n\n{"a": 1}'


def test_reasoning_is_split_from_the_answer() -> None:
    markers = ReasoningMarkers(end="</think>", start="<think>")
    assert markers.split(REASONED) == ("The user wants JSON.", '\n\n{"a": 1}')
    assert markers.split("<think>still thinking") == ("still thinking", "")
    assert ReasoningMarkers(end="</think>").split("no start marker</think>42") == ("no start marker", "42")


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 100])
def test_streamed_reasoning_splits_like_the_whole_text(step) -> None:
    markers = ReasoningMarkers(end="</think>", start="<think>")
    stream = markers.stream()
    pieces = [stream.feed(REASONED[i : i + step]) for i in range(0, len(REASONED), step)]
    assert ("".join(p[0] for p in pieces), "".join(p[1] for p in pieces)) == markers.split(REASONED)
    assert not any("<" in p[0] for p in pieces)  # no marker leaks, not even in part


def test_the_reasoning_content_reaches_the_response() -> None:
    result = GenerationResult([Completion(0, verdict("42"), [1], reasoning="Six times seven.")], None, 5)
    assert (
        chat_response(result, chat_plan(chat(), MODEL), model="m").choices[0].message.reasoning_content
        == "Six times seven."
    )


# ---------------------------------------------------------------- errors, auth, body limit


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    app.state.generation = SimpleNamespace(
        settings=ServerSettings(model_name="m", api_key="sk-1", reject_unaccepted=False)
    )
    errors.install(app)
    raised = {
        "schema": SchemaError("unknown type 'nonsense'", pointer="/properties/a/type", keyword="type"),
        "limit": LimitExceeded("the schema is 9 bytes; the limit is 1", keyword="max_schema_bytes"),
        "timeout": CompileTimeout("compilation took longer than 1 s and was stopped", keyword="compile_timeout_s"),
        "prompt": PromptTooLong("the prompt is 9000 tokens; this model's context is 8192 tokens", param="messages"),
        "model": ModelNotFound("the model 'x' is not served here", param="model"),
        "engine": EngineUnavailable("the engine is not started"),
        "unaccepted": Unaccepted(unaccepted([(0, verdict("{", VerdictStatus.TRUNCATED, "length"))], fit=False)),
        "bug": RuntimeError("secret internals"),
    }

    @app.post("/raise/{name}", dependencies=[Depends(require_api_key)])
    async def raise_it(name: str, body: ChatCompletionRequest) -> None:
        raise raised[name]

    @app.get("/reject")
    async def reject(mode: bool = Depends(reject_unaccepted)) -> dict[str, bool]:
        return {"reject": mode}

    app.add_middleware(BodyLimit, max_bytes=400)
    return TestClient(app, raise_server_exceptions=False, headers={"Authorization": "Bearer sk-1"})


BODY = {"model": "m", "messages": USER}


@pytest.mark.parametrize(
    "name, status, code, words",
    [
        ("schema", 400, "invalid_schema", "at /properties/a/type; keyword 'type'"),
        ("limit", 400, "limit_exceeded", "keyword 'max_schema_bytes'"),
        ("timeout", 400, "compile_timeout", "longer than 1 s"),
        ("prompt", 400, "context_length_exceeded", "9000 tokens"),
        ("model", 404, "model_not_found", "'x'"),
        ("engine", 503, "engine_unavailable", "not started"),
        ("unaccepted", 422, "unaccepted_output", "choice 0 is truncated: cut off"),
        ("bug", 500, "internal_error", "server log"),
    ],
)
def test_every_error_is_an_openai_error_body(client, name, status, code, words) -> None:
    response = client.post(f"/raise/{name}", json=BODY)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and words in error["message"] and error["type"]
    assert "secret" not in response.text
    if name == "unaccepted":
        assert error["validation"][0]["status"] == "truncated"


def test_request_validation_is_a_400_naming_the_field(client) -> None:
    response = client.post("/raise/schema", json={"model": "m", "messages": [{"role": "robot", "content": "x"}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].role"
    response = client.post("/raise/schema", content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_api_key_is_required(client) -> None:
    assert client.post("/raise/schema", json=BODY, headers={"Authorization": ""}).status_code == 401
    wrong = client.post("/raise/schema", json=BODY, headers={"Authorization": "Bearer sk-2"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_body_limit_counts_bytes_not_the_declared_length(client) -> None:
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 1000}]}
    declared = client.post("/raise/schema", json=big)
    assert declared.status_code == 413 and "limit is 400" in declared.json()["error"]["message"]

    def chunks():  # no Content-Length: sent chunked
        data = json.dumps(big).encode()
        for i in range(0, len(data), 100):
            yield data[i : i + 100]

    chunked = client.post("/raise/schema", content=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert "more than 400 bytes" in chunked.json()["error"]["message"]  # counted while read


def test_reject_header_overrides_the_server_setting(client) -> None:
    assert client.get("/reject").json() == {"reject": False}
    assert client.get("/reject", headers={REJECT_HEADER: "true"}).json() == {"reject": True}
    bad = client.get("/reject", headers={REJECT_HEADER: "maybe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == REJECT_HEADER


def test_stream_options_are_optional() -> None:
    assert chat(stream=True).stream_options is None
    assert chat(stream=True, stream_options={"include_usage": True}).stream_options == StreamOptions(include_usage=True)


def test_a_request_picks_its_tool_call_format_by_vllm_parser_name() -> None:
    from tokenmold.service.engine.model_info import ModelInfo

    model = ModelInfo("m", None, 49152, None, [], HERMES)
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    plan = chat_plan(chat(tools=tools, tool_choice="required", tool_call_format="kimi_k2"), model)
    assert plan.tool_format is not None and plan.tool_format.name == "kimi_k2"
    assert "<|tool_calls_section_begin|>" in plan.prompt.messages[0]["content"]  # the instruction's syntax
    assert chat_plan(chat(tools=tools, tool_choice="required"), model).tool_format is not None
    with pytest.raises(RequestError) as unknown:
        chat_plan(chat(tools=tools, tool_call_format="pythonic"), model)
    assert unknown.value.param == "tool_call_format" and "llama4_pythonic" in str(unknown.value)
