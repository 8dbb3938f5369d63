"""Tool-call formats per model family, each tested with its family's real chat template
(tests/fixtures/chat_templates/, sources in its README): detection, the template rendering the
definitions and a replayed call that the format's parser reads back, the grammar in the family's own
syntax, and the stream parser's pieces adding up to the complete parse."""

from __future__ import annotations

import json

import pytest
from support.paths import FIXTURES

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.toolformats import HERMES, ToolFormat
from tokenmold.grammar.tools import Tool, ToolCalls
from tokenmold.schemas.openai import ChatMessage, ToolDefinition
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.request.budget.fitting import fitted_layout
from tokenmold.service.request.toolformats import FORMATS, detect_tool_format, tool_format
from tokenmold.service.request.tools import chat_messages, tool_answer
from tokenmold.service.validation.verdicts import check_tool_calls

TEMPLATES = FIXTURES / "chat_templates"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "description": "a"}, "b": {"type": "integer", "description": "b"}},
    "required": ["a", "b"],
}
TOOLS = [Tool("get_weather", WEATHER, strict=True), Tool("add", ADD)]
CALLS = [("get_weather", {"city": "Paris \u00e9"}), ("add", {"a": 1, "b": 20})]

#: family -> (template fixture, where the replayed assistant turn starts and ends in the rendering)
FAMILIES = {
    "hermes": ("hermes.jinja", "<|im_start|>assistant", "<|im_end|>"),
    "llama3": ("llama3.1_json.jinja", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": ("mistral_parallel.jinja", "[TOOL_CALLS]", "<|im_end|>"),  # the test tokenizer's EOS
}


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


def template(name: str) -> str:
    return (TEMPLATES / FAMILIES[name][0]).read_text()


def definitions() -> list[ToolDefinition]:
    return [
        ToolDefinition.model_validate(
            {
                "type": "function",
                "function": {"name": t.name, "description": f"{t.name} tool", "parameters": t.parameters},
            }
        )
        for t in TOOLS
    ]


def parsed(fmt: ToolFormat, text: str) -> list[tuple[str, object]]:
    split = fmt.split(text)
    assert split.unclosed is None, split
    calls = [fmt.read_call(body) for body in split.calls]
    assert None not in calls, split.calls
    return [(c.name, json.loads(c.arguments)) for c in calls if c is not None]


# ---------------------------------------------------------------- detection


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_format_is_detected_from_the_family_template(name) -> None:
    assert detect_tool_format(template(name)) is FORMATS[name]


def test_a_template_without_tools_gets_hermes_and_names_resolve(tokenizer) -> None:
    assert detect_tool_format(tokenizer.chat_template) is HERMES  # SmolLM2's own template
    assert detect_tool_format(None) is HERMES
    assert tool_format("llama3") is FORMATS["llama3"]
    assert tool_format("llama3_json") is FORMATS["llama3"]
    with pytest.raises(ValueError, match="known: deepseek_v3, deepseek_v31"):
        tool_format("pythonic")


# ---------------------------------------------------------------- the real template, rendered and parsed


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_family_template_renders_tools_and_a_replayed_call_parses_back(name, tokenizer) -> None:
    fmt = FORMATS[name]
    _, begin, end = FAMILIES[name]
    history = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_5d4c3b2a1f0e",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps(CALLS[0][1])},
                    }
                ],
            }
        ),
        ChatMessage(role="tool", tool_call_id="call_5d4c3b2a1f0e", content="18 C"),
    ]
    messages, tools = chat_messages(
        history, tools=definitions(), choice="auto", template_renders_tools=True, tool_format=fmt
    )
    text = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template(name), tokenize=False, add_generation_prompt=True
    )
    assert "get_weather tool" in text and "add tool" in text  # the definitions reached the prompt
    assert "18 C" in text
    turn = text[text.index(begin) :]
    turn = turn[: turn.index(end)]
    assert parsed(fmt, turn) == [CALLS[0]]


def test_mistral_call_ids_are_what_its_template_accepts() -> None:
    fmt = FORMATS["mistral"]
    ids = {fmt.new_call_id() for _ in range(20)}
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(ids) == 20
    assert fmt.replay_id("call_5d4c3b2a1f0e") == "4c3b2a1f0e"[-9:]
    assert fmt.replay_id("ab") == "0000000ab"


# ---------------------------------------------------------------- the grammar speaks the family's syntax


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_grammar_writes_calls_in_the_family_syntax(name, inline) -> None:
    fmt = FORMATS[name]
    one, both = fmt.render_calls(CALLS[:1]), fmt.render_calls(CALLS)
    required = inline.compile(Shape.from_tools(TOOLS, required=True, parallel=True, tool_format=fmt))
    assert required.accepts(one) and required.accepts(both)
    assert not required.accepts("It is sunny.")
    assert not required.accepts(fmt.render_calls([("get_weather", {"town": "Paris"})]))
    for other in (FORMATS[family] for family in FAMILIES):
        if other is not fmt:
            assert not required.accepts(other.render_calls(CALLS[:1])), other.name
    single = inline.compile(Shape.from_tools(TOOLS, required=True, parallel=False, tool_format=fmt))
    assert single.accepts(one) and not single.accepts(both)
    auto = inline.compile(Shape.from_tools(TOOLS, required=False, parallel=False, tool_format=fmt))
    assert auto.accepts("It is sunny.") and auto.accepts(f"Let me check. {one}")
    assert parsed(fmt, f"Let me check. {both}") == CALLS


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_arguments_are_laid_out_as_the_model_writes_them(vocab, backend) -> None:
    """Without budget fitting the model lays its arguments out as it likes (``{"a": 1, "b": 20}``,
    compact, one member per line), as vLLM's JSON grammar lets it."""
    compiled = ShapeCompiler(vocab, isolation="inline", backend=backend).compile(
        Shape.from_tools(TOOLS, required=True, parallel=True)
    )
    assert compiled.engine_spec.backend == backend
    both = HERMES.render_calls(CALLS)
    assert '"arguments": {"a": 1, "b": 20}}' in both
    assert compiled.accepts(both)
    assert compiled.accepts(both.replace('{"a": 1, "b": 20}', '{"a":1,"b":20}'))
    if backend == "llguidance":  # xgrammar's whitespace is bounded (``max_whitespace``)
        assert compiled.accepts(both.replace('{"a": 1, "b": 20}', '{\n    "a": 1,\n    "b": 20\n}'))


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
def test_fitted_arguments_hold_the_layout_json_dumps_writes(vocab, backend) -> None:
    """Under budget fitting the arguments hold one layout, the one its plan prices: compact ones
    are refused, by both backends."""
    compiled = ShapeCompiler(vocab, isolation="inline", backend=backend).compile(
        fitted_layout(Shape.from_tools(TOOLS, required=True, parallel=True))
    )
    both = HERMES.render_calls(CALLS)
    assert compiled.accepts(both)
    assert not compiled.accepts(both.replace('{"a": 1, "b": 20}', '{"a":1,"b":20}'))


@pytest.mark.parametrize("between", ["", "\n", "\n\n "])
def test_hermes_calls_parse_with_nothing_or_whitespace_between_them(between) -> None:
    """The grammar puts nothing between parallel calls (as vLLM's hermes tag); a model that writes
    whitespace there (``tool_choice: auto``) is read the same, whole and streamed."""
    first, second = HERMES.render_calls(CALLS[:1]), HERMES.render_calls(CALLS[1:])
    text = first + between + second
    assert HERMES.render_calls(CALLS) == first + second
    assert parsed(HERMES, text) == CALLS
    stream = HERMES.stream()
    pieces = [piece for char in text for piece in stream.feed(char).calls]
    names = [p.name for p in pieces if p.name]
    streamed = ["".join(p.arguments for p in pieces if p.index == i) for i in range(2)]
    assert names == ["get_weather", "add"]
    assert [json.loads(a) for a in streamed] == [arguments for _, arguments in CALLS]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tool_answer_returns_openai_calls_in_each_format(name) -> None:
    fmt = FORMATS[name]
    text = f"Checking. {fmt.render_calls(CALLS)}"
    verdict = Verdict(
        status=VerdictStatus.ACCEPTED,
        finish_reason="stop",
        text=text,
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )
    answer = tool_answer(verdict, tool_format=fmt)
    assert answer.finish_reason == "tool_calls" and answer.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.tool_calls] == CALLS
    # Cut off inside the second call: the first stands, the second is dropped, no markup as content.
    cut = tool_answer(verdict.model_copy(update={"text": text[:-3], "finish_reason": "length"}), tool_format=fmt)
    assert cut.finish_reason == "length" and cut.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in cut.tool_calls] == CALLS[:1]


# ---------------------------------------------------------------- streaming


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("size", [1, 2, 5])
def test_stream_pieces_add_up_to_the_complete_parse(name, size) -> None:
    fmt = FORMATS[name]
    text = f"Let me check. {fmt.render_calls(CALLS)}"
    stream = fmt.stream()
    content, names, fragments = "", {}, {}
    for start in range(0, len(text), size):
        piece = stream.feed(text[start : start + size])
        assert not any(trigger in piece.content for trigger in fmt.triggers)
        content += piece.content
        # One entry per call in a chunk (the openai SDK's stream helper takes a repeated index
        # for another call).
        assert len({call.index for call in piece.calls}) == len(piece.calls)
        for call in piece.calls:
            if call.name is not None:
                assert call.index == len(names), "calls open in order, each once"
                names[call.index] = call.name
            fragments.setdefault(call.index, []).append(call.arguments)
    assert content == "Let me check."
    assert [(names[i], json.loads("".join(fragments[i]))) for i in sorted(names)] == CALLS
    assert all(len([f for f in fragments[i] if f]) >= 3 for i in names)
    # what the complete answer says, the stream already said
    split = fmt.split(text)
    read = [fmt.read_call(body) for body in split.calls]
    assert ["".join(fragments[i]) for i in sorted(names)] == [c.arguments for c in read if c is not None]
    assert stream.finish(split.content.strip(), [c for c in read if c is not None]).calls == []


def test_stream_holds_back_only_what_could_begin_a_call() -> None:
    stream = HERMES.stream()
    assert stream.feed("Sure <").content == "Sure"
    assert stream.feed("b> and <tool").content == " <b> and"
    assert stream.feed("_call>").content == ""


# ---------------------------------------------------------------- validation, model, command line


def test_validation_reads_calls_in_the_format_and_names_paths_as_written() -> None:
    fmt = FORMATS["llama3"]
    calls = ToolCalls(tuple(TOOLS), required=True, parallel=True, tool_format=fmt)
    values, errors = check_tool_calls(fmt.render_calls(CALLS), calls)
    assert errors == [] and values == [{"name": n, "arguments": a} for n, a in CALLS]
    _, errors = check_tool_calls(fmt.render_calls([("get_weather", {"city": 3})]), calls)
    assert [(e.path, e.keyword) for e in errors] == [("/0/parameters/city", "type")]


def test_the_model_detects_its_format_and_the_flag_overrides_it(model_path) -> None:
    from tokenmold.service.cli.main import _parser
    from tokenmold.service.engine.model_info import ModelInfo

    assert ModelInfo.load(model_path).tool_format is HERMES
    assert ModelInfo.load(model_path, tool_call_format="mistral").tool_format is FORMATS["mistral"]
    assert _parser().parse_args(["serve", "--tool-call-format", "llama3"]).tool_call_format == "llama3"
    assert ModelInfo.load(model_path, tool_call_format="llama3_json").tool_format is FORMATS["llama3"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--tool-call-format", "pythonic"])
