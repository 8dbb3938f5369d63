"""The formats the registries keep (vLLM's tool parsers, the structural-tag registry): each name on
the command line, the grammar writing the family's own syntax (markers written as text: the
embedded tokenizer has none of the families' special tokens), vLLM's parser reading it back whole
and streamed, a call cut off never returned, and budget fitting refused up front."""

from __future__ import annotations

import json

import pytest

from tokenmold.grammar import Shape, ShapeCompiler
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import Tool
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.errors import FitUnplannable
from tokenmold.service.request.toolformats import FORMATS, detect_tool_format
from tokenmold.service.request.tools import tool_answer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [Tool("get_weather", WEATHER)]
CALL = ("get_weather", {"city": "Paris", "days": 3})
REGISTRY = sorted(name for name, fmt in FORMATS.items() if isinstance(fmt, RegistryFormat))


@pytest.fixture(scope="module")
def inline(vocab) -> ShapeCompiler:
    return ShapeCompiler(vocab, isolation="inline")


def bound(name: str) -> RegistryFormat:
    fmt = FORMATS[name].bind(TOOLS)
    assert isinstance(fmt, RegistryFormat)
    return fmt


@pytest.mark.parametrize("name", REGISTRY)
def test_the_registry_grammar_writes_what_vllm_parses(name, inline) -> None:
    fmt = bound(name)
    text = fmt.render_calls([CALL])
    required = inline.compile(Shape.from_tools(TOOLS, required=True, parallel=False, tool_format=fmt))
    assert required.engine_spec.backend == "xgrammar"
    assert required.accepts(text), text
    assert not required.accepts("It is sunny.")
    assert not required.accepts(fmt.render_calls([("get_weather", {"city": "Paris"})]))
    assert not required.accepts(fmt.render_calls([CALL, CALL]))
    split = fmt.split(text)
    assert split.unclosed is None and [json.loads(body) for body in split.calls] == [
        {"name": CALL[0], "arguments": CALL[1]}
    ]


@pytest.mark.parametrize("name", REGISTRY)
def test_the_stream_gives_the_arguments_as_written_and_adds_up(name) -> None:
    fmt = bound(name)
    text = fmt.render_calls([CALL])
    stream = fmt.stream()
    names, arguments, fragments = [], "", 0
    for start in range(0, len(text), 2):
        for call in stream.feed(text[start : start + 2]).calls:
            assert call.index == 0
            names += [call.name] if call.name else []
            arguments += call.arguments
            fragments += bool(call.arguments)
    (whole,) = tool_answer(verdict(text), tool_format=fmt).tool_calls or []
    rest = stream.finish(None, [_parsed(whole)])
    arguments += "".join(call.arguments for call in rest.calls)
    assert names == ["get_weather"] and json.loads(arguments) == CALL[1] == json.loads(whole.function.arguments)
    assert fragments >= 3 or name == "granite4"  # vLLM's granite4 parser sends a call whole


@pytest.mark.parametrize("name", ["qwen3_coder", "deepseek_v31", "kimi_k2", "llama4_pythonic", "glm45"])
def test_a_call_cut_off_is_never_returned(name) -> None:
    fmt = bound(name)
    text = fmt.render_calls([CALL])
    cut = tool_answer(verdict(text[: len(text) * 2 // 3], finish="length"), tool_format=fmt)
    assert cut.tool_calls is None and cut.finish_reason == "length"
    assert fmt.split(text[: len(text) * 2 // 3]).unclosed is not None


@pytest.mark.parametrize("name", ["deepseek_v31", "kimi_k2", "minimax_m2", "qwen3_coder", "glm45"])
def test_the_calls_before_one_cut_off_stand(name) -> None:
    fmt = bound(name)
    text = fmt.render_calls([CALL, ("get_weather", {"city": "Rome", "days": 1})])
    cut = tool_answer(verdict(text[: len(text) - len(text) // 4], finish="length"), tool_format=fmt)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in cut.tool_calls or []] == [CALL]


def test_budget_fit_is_refused_up_front_for_a_registry_format(inline) -> None:
    from tokenmold.service.request.budget.fitting import _fit_target

    compiled = inline.compile(Shape.from_tools(TOOLS, required=True, parallel=False, tool_format=bound("kimi_k2")))
    with pytest.raises(FitUnplannable) as refused:
        _fit_target(compiled)
    assert refused.value.param == "budget" and "kimi_k2" in str(refused.value)


def test_detection_and_markers() -> None:
    assert detect_tool_format("{{ '<tool_call>\\n<function=' }}{{ '<parameter=' }}").name == "qwen3_coder"
    assert detect_tool_format("<|tool_calls_section_begin|>").name == "kimi_k2"
    assert detect_tool_format("<tool_call>{{ name }}<arg_key>").name == "glm45"
    assert detect_tool_format("<tool_call>").name == "hermes"
    assert bound("deepseek_v31").control_tokens and not bound("qwen3_coder").control_tokens


def verdict(text: str, finish: str = "stop") -> Verdict:
    return Verdict(
        status=VerdictStatus.ACCEPTED,
        finish_reason=finish,
        text=text,
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )


def _parsed(call):
    from tokenmold.grammar.toolformats import ParsedCall

    return ParsedCall(call.function.name, call.function.arguments)


@pytest.mark.parametrize(("name", "model"), [("hermes", "hermes"), ("llama3", "llama")])
def test_the_written_formats_spell_calls_as_the_registry_does(name, model) -> None:
    """Hermes and Llama 3 keep their one ``CallSyntax`` (fitting and the guard follow it): it is
    the registry's own spelling of a call, the first of vLLM's tags for that model."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    tool = ChatCompletionToolsParam(type="function", function={"name": "get_weather", "parameters": WEATHER})
    tag = get_model_structural_tag(model, [tool], "auto", False, strict_level=ToolStrictLevel.PARAMETER)
    assert tag is not None
    first = tag.model_dump(mode="json")["format"]["tags"][0]
    syntax = FORMATS[name].syntax
    assert (first["begin"], first["end"]) == (syntax.begin("get_weather"), syntax.call_end)
