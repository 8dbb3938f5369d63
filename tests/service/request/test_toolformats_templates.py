"""The registries' families with their public chat templates (tests/fixtures/chat_templates/,
sources in its README): the format is detected from the template; the template renders the tool
definitions, a replayed call, its result and a second turn; the replayed call, as the template
writes it, is read back by the family's vLLM parser, whole and streamed."""

from __future__ import annotations

import json

import pytest
from support.paths import FIXTURES

from tokenmold.grammar.tools import Tool
from tokenmold.schemas.openai import ChatMessage, ToolDefinition
from tokenmold.service.request.toolformats import FORMATS, detect_tool_format
from tokenmold.service.request.tools import chat_messages

TEMPLATES = FIXTURES / "chat_templates"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
ARGUMENTS = {"city": "Paris", "days": 3}
QUESTION = "Weather in Paris for three days?"

#: family -> (template fixture, where the replayed call starts and ends in the rendering after the
#: question, the arguments as the template writes them: Llama 4's quotes every value)
FAMILIES = {
    "qwen3_coder": ("qwen3coder.jinja", "<tool_call>", "<|im_end|>", ARGUMENTS),
    "deepseek_v31": ("deepseekv31.jinja", "<｜tool▁calls▁begin｜>", "<｜end▁of▁sentence｜>", ARGUMENTS),
    "llama4_pythonic": ("llama4_pythonic.jinja", "[get_weather(", "<|eot|>", {"city": "Paris", "days": "3"}),
}


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def conversation() -> list[ChatMessage]:
    call = {"id": "call_5d4c3b2a1f0e", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = json.dumps(ARGUMENTS)  # type: ignore[index]
    return [
        ChatMessage(role="user", content=QUESTION),
        ChatMessage.model_validate({"role": "assistant", "content": "", "tool_calls": [call]}),
        ChatMessage(role="tool", tool_call_id="call_5d4c3b2a1f0e", content="18 C and sunny"),
        ChatMessage(role="user", content="And tomorrow?"),
    ]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_family_template_renders_a_call_its_parser_reads_back(name, tokenizer) -> None:
    file, begin, end, written = FAMILIES[name]
    template = (TEMPLATES / file).read_text()
    fmt = detect_tool_format(template)
    assert fmt is FORMATS[name]
    fmt = fmt.bind([Tool("get_weather", WEATHER)])
    definitions = [
        ToolDefinition.model_validate(
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "weather tool", "parameters": WEATHER},
            }
        )
    ]
    messages, tools = chat_messages(
        conversation(), tools=definitions, choice="auto", template_renders_tools=True, tool_format=fmt
    )
    text = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert "get_weather" in text and "18 C and sunny" in text and text.rstrip().count("And tomorrow?") == 1
    turn = text[text.index(QUESTION) :]  # the system prompt's own examples before it aside
    turn = turn[turn.index(begin) :]
    turn = turn[: turn.index(end)]
    whole = fmt.split(turn)
    assert [json.loads(body) for body in whole.calls] == [{"name": "get_weather", "arguments": written}]
    stream, streamed = fmt.stream(), ""
    for start in range(0, len(turn), 3):
        streamed += "".join(call.arguments for call in stream.feed(turn[start : start + 3]).calls)
    assert json.loads(streamed) == written
