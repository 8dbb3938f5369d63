"""The Responses API without the engine: requests to chat plans, chat answers to response objects,
stream deltas to the named event sequence. The same paths run end to end in tests/http/test_responses.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pydantic
import pytest

from tokenmold.grammar import ShapeKind
from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatUsage
from tokenmold.schemas.responses import ResponsesRequest
from tokenmold.schemas.verdict import Partial, Usage, Verdict, VerdictError, VerdictStatus
from tokenmold.service.api.generation import ChunkFrames
from tokenmold.service.api.responses import ResponsesStream, response_from_chat, response_shell, responses_plan
from tokenmold.service.api.translate import ChatStream, chat_response, unaccepted
from tokenmold.service.errors import RequestError
from tokenmold.service.request.runtime import Completion, GenerationResult, StreamDelta

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=True, tool_format=HERMES)
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def verdict(text: str, finish_reason: str = "stop", status: VerdictStatus = VerdictStatus.ACCEPTED) -> Verdict:
    errors = [] if status is VerdictStatus.ACCEPTED else [VerdictError(path="", keyword="x", message="cut off")]
    return Verdict(
        status=status,
        finish_reason=finish_reason,
        text=text,
        errors=errors,
        usage=Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8),
    )


# ---------------------------------------------------------------- requests -> chat plans


def test_instructions_and_items_become_chat_messages() -> None:
    body = request(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "weather?"},  # an easy message: no type
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}", "status": "done"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "developer", "content": [{"type": "input_text", "text": "JSON please"}]},
        ],
        tools=[TOOL],
    )
    messages = responses_plan(body, MODEL).prompt.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "system"]
    assert messages[0]["content"] == "Be brief." and messages[2]["content"] == "Let me see."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "get_weather"}
    assert messages[4]["content"] == "rain" and messages[5]["content"] == "JSON please"


def test_text_format_becomes_the_shape_named_as_the_responses_field() -> None:
    plan = responses_plan(request(text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}), MODEL)
    assert plan.shape.kind is ShapeKind.JSON_SCHEMA and plan.shape.source == SCHEMA
    assert plan.shape_param == "text.format.schema" and not plan.options.strict
    plan = responses_plan(request(text={"format": {"type": "json_object"}}), MODEL)
    assert plan.shape.source == {"type": "object"} and plan.shape_param == "text.format"
    assert responses_plan(request(text={"format": {"type": "text"}, "verbosity": "low"}), MODEL).shape is None


def test_function_tools_are_strict_by_default_and_tool_choice_maps() -> None:
    plan = responses_plan(request(tools=[TOOL], tool_choice="required"), MODEL)
    assert plan.tool_format is not None and plan.prompt.tools[0]["function"]["strict"] is True
    lax = {**TOOL, "strict": False, "name": "other"}
    plan = responses_plan(
        request(
            tools=[TOOL, lax],
            tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]},
        ),
        MODEL,
    )
    assert [t["function"]["name"] for t in plan.prompt.tools] == ["other"]
    assert plan.prompt.tools[0]["function"]["strict"] is False
    named = responses_plan(request(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}), MODEL)
    assert named.tool_format is not None
    assert responses_plan(request(tools=[TOOL], tool_choice="none"), MODEL).shape is None
    # The Agents SDK sends both when an agent has tools and an output_type: a call or the answer.
    both = responses_plan(
        request(tools=[TOOL], text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}), MODEL
    )
    assert both.shape.kind is ShapeKind.TOOLS and both.shape.source.answer is not None


def test_sampling_fields_and_extensions_reach_the_plan() -> None:
    plan = responses_plan(
        request(
            max_output_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=4,
            seed=3,
            stop="END",
            include=["message.output_text.logprobs"],
            top_logprobs=2,
            regex="[a-z]+",
        ),
        MODEL,
    )
    s = plan.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop, s.logprobs) == (
        7,
        0.5,
        0.9,
        4,
        3,
        ["END"],
        2,
    )
    assert plan.shape.kind is ShapeKind.REGEX
    assert responses_plan(request(top_logprobs=2), MODEL).sampling.logprobs is None
    vllm = responses_plan(
        request(
            structured_outputs={"json": SCHEMA, "disable_any_whitespace": True},
            chat_template_kwargs={"enable_thinking": False},
            stop_token_ids=[7],
        ),
        MODEL,
    )
    assert vllm.shape.source == SCHEMA and vllm.options.max_whitespace == 0
    assert vllm.prompt.template_kwargs == {"enable_thinking": False} and vllm.sampling.stop_token_ids == [7]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [], "instructions": "x"}, "input"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [TOOL],
                "tool_choice": {
                    "type": "allowed_tools",
                    "mode": "auto",
                    "tools": [{"type": "function", "name": "nope"}],
                },
            },
            "tool_choice.tools",
        ),
    ],
)
def test_what_is_not_served_or_conflicts_is_refused_with_the_field(fields, param) -> None:
    with pytest.raises(RequestError) as exc:
        responses_plan(request(**fields), MODEL)
    assert exc.value.param == param


def test_every_openai_field_is_accepted_and_unknown_ones_are_not() -> None:
    request(
        store=True,
        metadata={"a": "b"},
        user="u",
        safety_identifier="s",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        prompt_cache_options={"mode": "implicit"},
        service_tier="flex",
        truncation="auto",
        reasoning={"effort": "low", "summary": "auto"},
        max_tool_calls=3,
        context_management=[{"type": "compaction"}],
        moderation={"model": "omni-moderation-latest"},
        stream_options={"include_obfuscation": False},
        include=["reasoning.encrypted_content"],
        parallel_tool_calls=False,
        background=False,
    )
    for bad in (
        {"frobnicate": 1},
        {"input": [{"type": "computer_call", "id": "x"}]},
        {"tools": [{"type": "web_search"}]},
    ):
        with pytest.raises(pydantic.ValidationError):
            request(**bad)


# ---------------------------------------------------------------- chat answers -> response objects


def _result(text: str, finish: str = "stop", status: VerdictStatus = VerdictStatus.ACCEPTED) -> GenerationResult:
    return GenerationResult([Completion(0, verdict(text, finish, status), [1, 2, 3])], None, prompt_tokens=5)


def _answer(body: ResponsesRequest, result: GenerationResult):
    plan = responses_plan(body, MODEL)
    return response_from_chat(chat_response(result, plan, model="m"), response_shell(body, model="m"))


def test_a_text_answer_is_one_message_with_usage_and_validation() -> None:
    body = request(text={"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}, metadata={"k": "v"})
    response = _answer(body, _result('{"a": 1}'))
    assert response.status == "completed" and response.incomplete_details is None
    (message,) = response.output
    assert message.type == "message" and message.status == "completed" and message.content[0].text == '{"a": 1}'
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (5, 3, 8)
    assert response.validation.status is VerdictStatus.ACCEPTED
    assert response.text.format.type == "json_schema" and response.metadata == {"k": "v"}
    assert response.id.startswith("resp-")


def test_tool_calls_become_function_call_items_and_a_cut_off_is_incomplete() -> None:
    body = request(tools=[TOOL], tool_choice="required")
    (call,) = _answer(body, _result(CALL)).output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    cut = _answer(body, _result(CALL[:19], "length", VerdictStatus.TRUNCATED))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    (message,) = cut.output  # the call's markup is never the message's text
    assert message.type == "message" and message.status == "incomplete" and message.content[0].text == ""
    # Cut off inside a second call: the first comes back as a function_call item.
    cut = _answer(body, _result(CALL + "\n" + CALL[:19], "length", VerdictStatus.TRUNCATED))
    assert cut.status == "incomplete"
    (kept,) = [item for item in cut.output if item.type == "function_call"]
    assert kept.name == "get_weather" and json.loads(kept.arguments) == {"city": "Paris"}
    assert all(item.type != "message" or not item.content[0].text for item in cut.output)
    assert cut.validation.status is VerdictStatus.TRUNCATED


# ---------------------------------------------------------------- streamed events


def _events(body: ResponsesRequest, deltas: list[StreamDelta], rejected: bool = False) -> list[tuple[str, dict]]:
    plan = responses_plan(body, MODEL)
    stream = ResponsesStream(plan, response_shell(body, model="m"), model="m")
    frames = [frame for d in deltas for frame in stream.events(d)]
    verdicts = [(d.index, d.verdict) for d in deltas if d.verdict is not None]
    frames += stream.closing(unaccepted(verdicts, fit=False) if rejected else [])
    out = []
    for frame in frames:
        event, data = frame.removesuffix("\n\n").split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_text_stream_opens_grows_and_closes_its_message() -> None:
    events = _events(request(), [StreamDelta(0, "Hel", [1]), StreamDelta(0, "lo", [2], verdict=verdict("Hello"))])
    assert [kind for kind, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(data["type"] == kind for kind, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[0][1]["response"]["status"] == "in_progress"
    assert [data["delta"] for kind, data in events if kind.endswith(".delta")] == ["Hel", "lo"]
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello"
    assert final["validation"]["status"] == "accepted" and final["usage"]["output_tokens"] == 3
    assert events[2][1]["item"]["id"] == final["output"][0]["id"]


def test_a_streamed_call_is_announced_then_its_arguments_then_done() -> None:
    body = request(tools=[TOOL], tool_choice="required")
    events = _events(body, [StreamDelta(0, CALL[:15], [1]), StreamDelta(0, CALL[15:], [2], verdict=verdict(CALL))])
    kinds = [kind for kind, _ in events]
    assert kinds[2] == "response.output_item.added" and events[2][1]["item"]["type"] == "function_call"
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    fragments = "".join(d["delta"] for k, d in events if k == "response.function_call_arguments.delta")
    assert fragments == events[-3][1]["arguments"] and json.loads(fragments) == {"city": "Paris"}
    assert events[-1][1]["response"]["output"][0]["status"] == "completed"


def test_call_fragments_in_openais_streaming_form_become_argument_deltas() -> None:
    """The chat stream's incremental form (id and name on a call's first delta only; then argument
    fragments): each fragment is one ``function_call_arguments.delta``."""
    from tokenmold.schemas.openai import ChatChunkChoice, ChatCompletionChunk, ChatDelta, Validation

    def chunk(index: int, *, id=None, name=None, arguments=None, finish=None):
        call = SimpleNamespace(index=index, id=id, function=SimpleNamespace(name=name, arguments=arguments))
        delta = ChatDelta.model_construct(role=None, content=None, reasoning_content=None, tool_calls=[call])
        check = Validation(status=VerdictStatus.ACCEPTED) if finish else None
        choice = ChatChunkChoice.model_construct(
            index=0, delta=delta, logprobs=None, finish_reason=finish, validation=check
        )
        return ChatCompletionChunk.model_construct(id="c", created=0, model="m", choices=[choice], usage=None)

    scripted = [
        [chunk(0, id="call_a", name="get_weather", arguments="")],
        [chunk(0, arguments='{"city": ')],
        [chunk(0, arguments='"Par')],
        [chunk(0, arguments='is"}', finish="tool_calls")],
    ]
    body = request(tools=[TOOL], tool_choice="required")
    stream = ResponsesStream(responses_plan(body, MODEL), response_shell(body, model="m"), model="m")
    stream.chat = SimpleNamespace(
        chunks=lambda delta: scripted.pop(0),
        usage_chunk=lambda: SimpleNamespace(usage=ChatUsage(**verdict("").usage.model_dump())),
    )
    frames = [f for _ in range(4) for f in stream.events(StreamDelta(0, "", []))] + stream.closing([])
    events = [json.loads(f.split("\ndata: ")[1]) for f in frames]
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert fragments == ['{"city": ', '"Par', 'is"}']
    call = events[-1]["response"]["output"][0]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_a", "get_weather", '{"city": "Paris"}')
    assert [e["type"] for e in events][-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_parallel_calls_are_items_one_after_the_other() -> None:
    two = CALL + "\n" + CALL.replace("Paris", "Rome")
    events = _events(request(tools=[TOOL], tool_choice="required"), [StreamDelta(0, two, [1], verdict=verdict(two))])
    items = [(kind, data["output_index"]) for kind, data in events if kind.startswith("response.output_item")]
    assert items == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
    ]
    calls = events[-1][1]["response"]["output"]
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "Rome"]
    assert calls[0]["call_id"] != calls[1]["call_id"]


def test_reasoning_streams_as_its_own_item_before_the_message() -> None:
    deltas = [StreamDelta(0, "", [1], reasoning="Let me think."), StreamDelta(0, "Hi", [2], verdict=verdict("Hi"))]
    events = _events(request(), deltas)
    items = [(k, d["item"]["type"]) for k, d in events if k.startswith("response.output_item")]
    assert items == [
        ("response.output_item.added", "reasoning"),
        ("response.output_item.done", "reasoning"),
        ("response.output_item.added", "message"),
        ("response.output_item.done", "message"),
    ]
    assert ("response.reasoning_text.delta", "Let me think.") in [(k, d.get("delta")) for k, d in events]
    output = events[-1][1]["response"]["output"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert output[1]["content"][0]["text"] == "Hi"


def test_a_cut_off_stream_ends_incomplete_or_in_422_mode_with_the_error() -> None:
    cut = [StreamDelta(0, "{", [1], verdict=verdict("{", "length", VerdictStatus.TRUNCATED))]
    events = _events(request(), cut)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2][1]["item"]["status"] == "incomplete"
    kind, data = _events(request(), cut, rejected=True)[-1]
    assert kind == "error" and data["error"]["code"] == "unaccepted_output"
    assert data["error"]["validation"][0]["status"] == "truncated"


def test_closed_parts_follow_their_text_as_output_json_partial_events() -> None:
    part = Partial(pointer="/a", value=1, status=VerdictStatus.ACCEPTED)
    deltas = [StreamDelta(0, '{"a": 1', [1]), StreamDelta(0, "}", [2], verdict=verdict('{"a": 1}'), partials=[part])]
    events = _events(request(partials=True), deltas)
    kinds = [kind for kind, _ in events]
    at = kinds.index("response.output_json.partial")
    assert kinds[at - 1] == "response.output_text.delta" and events[at - 1][1]["delta"] == "}"
    assert events[at][1]["partials"] == [part.model_dump(mode="json")]
    assert events[at][1]["item_id"] == events[-1][1]["response"]["output"][0]["id"]
    assert kinds.count("response.output_json.partial") == 1


def test_chat_frames_are_data_lines_ending_in_done() -> None:
    frames = ChunkFrames(ChatStream(responses_plan(request(), MODEL), model="m"), include_usage=True)
    lines = frames.events(StreamDelta(0, "hi", [1], verdict=verdict("hi"))) + frames.closing([])
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]\n\n"
    assert json.loads(lines[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 3


# ---------------------------------------------------------------- the SDK reads what the app writes


class _ScriptedRuntime:
    """Stands in for ``Runtime``: the n-th request gets ``texts[n]`` (split in two deltas when
    streamed); ``prompts`` records what each request asked."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.prompts: list = []
        self.model = MODEL
        self.compiler = SimpleNamespace(
            cache_stats=lambda: SimpleNamespace(hits=0, misses=0, evictions=0, entries=0, bytes=0),
            pool_stats=lambda: None,
            store=None,
        )
        self.config = SimpleNamespace(engine=SimpleNamespace(max_num_seqs=64))

    def engine_stats(self) -> None:
        return None

    async def compile(self, shape, options, *, fit=False):
        return None

    async def generate(self, prompt, compiled, sampling):
        self.prompts.append(prompt)
        return _result(self.texts.pop(0))

    async def stream(self, prompt, compiled, sampling):
        self.prompts.append(prompt)
        text = self.texts.pop(0)
        yield StreamDelta(0, text[: len(text) // 2], [1])
        yield StreamDelta(0, text[len(text) // 2 :], [2], verdict=verdict(text))


def _app(runtime: _ScriptedRuntime):
    from tokenmold.service.api.app import create_app
    from tokenmold.service.api.settings import ServerSettings

    return create_app(runtime, ServerSettings(model_name="m"))  # no lifespan: no engine start


def _sdk(text: str):
    import openai
    from fastapi.testclient import TestClient

    http = TestClient(_app(_ScriptedRuntime(text, text)))
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


class Pair(pydantic.BaseModel):
    a: int


def test_the_sdk_parses_and_streams_the_apps_responses() -> None:
    client = _sdk('{"a": 1}')
    response = client.responses.parse(model="m", input="hi", text_format=Pair)
    assert response.output_parsed == Pair(a=1) and response.model_extra["validation"]["status"] == "accepted"
    with client.responses.stream(model="m", input="hi", text_format=Pair) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_parsed == Pair(a=1) and final.output_text == '{"a": 1}'


def test_the_sdk_reads_streamed_function_calls() -> None:
    client = _sdk(CALL)
    tool = {**TOOL, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    with client.responses.stream(model="m", input="hi", tools=[tool], tool_choice="required") as stream:
        done = [e for e in stream if e.type == "response.function_call_arguments.done"]
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert done[0].arguments == call.arguments


class WeatherReport(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    city: str
    sunny: bool


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("model_kind", ["responses", "chat_completions"])
def test_the_agents_sdk_models_call_the_tool_and_parse_the_output(model_kind, streamed) -> None:
    """The protocol only (the model's answers are scripted): tests/http/test_responses.py runs the same
    agent on the real engine."""
    import asyncio

    import agents
    import httpx
    import openai
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)
    runtime = _ScriptedRuntime(CALL, '{"city": "Paris", "sunny": true}')
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(runtime)), base_url="http://testserver")
    client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"It is sunny in {city}."

    kind = OpenAIResponsesModel if model_kind == "responses" else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        model=kind(model="m", openai_client=client),
        tools=[get_weather],
        output_type=WeatherReport,
        model_settings=ModelSettings(tool_choice="required"),
    )

    async def run() -> object:
        if not streamed:
            return (await Runner.run(agent, "Weather in Paris?", max_turns=3)).final_output
        result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == WeatherReport(city="Paris", sunny=True) and called == ["Paris"]
    # The second request replays the call and its output.
    messages = runtime.prompts[1].messages
    assert [m["role"] for m in messages][-2:] == ["assistant", "tool"]
    assert messages[-1]["content"] == "It is sunny in Paris." and messages[-1]["tool_call_id"]
    assert messages[-2]["tool_calls"][0]["id"] == messages[-1]["tool_call_id"]
