"""Grammars as vLLM's and OpenAI's users write them, on the shared live server with the openai SDK:
Lark in the ``grammar`` fields, xgrammar structural tags, and custom tools whose input a Lark grammar
holds (chat and Responses, streamed and not). Each output is checked with the ``lark`` package,
independent of the llguidance grammar that shaped it. The same requests without the engine are in
test_grammar_dialects.py and test_custom_tools.py."""

from __future__ import annotations

import json

import jsonschema
import lark
import openai
import pytest
from support.live_api import MODEL, validation

pytestmark = pytest.mark.engine

COLOR = 'start: "The sky is " COLOR "."\nCOLOR: "blue" | "grey" | "red"'
SQL = 'start: "SELECT " NAME " FROM " NAME\nNAME: /[a-z_]{1,12}/'
SQL_TOOL = {
    "type": "custom",
    "custom": {
        "name": "sql",
        "description": "Runs one SQL query on the users database.",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": SQL}},
    },
}
ASK = [{"role": "user", "content": "Get the names of all users."}]
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}


def parses(grammar: str, text: str) -> bool:
    """Whether the ``lark`` package's parser reads ``text`` as a sentence of ``grammar``."""
    try:
        lark.Lark(grammar, start="start").parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def test_a_lark_grammar_shapes_the_answer_on_both_routes(client) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What colour is the sky?"}],
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"grammar": COLOR}},
    ).choices[0]
    assert chat.finish_reason == "stop" and validation(chat)["status"] == "accepted", chat
    assert parses(COLOR, chat.message.content), chat.message.content
    text = client.completions.create(
        model=MODEL,
        prompt="Q: the sky's colour?\nA:",
        max_tokens=20,
        temperature=0,
        extra_body={"guided_grammar": COLOR},
    ).choices[0]
    assert validation(text)["status"] == "accepted" and parses(COLOR, text.text), text.text


@pytest.mark.parametrize(
    "tag",
    [
        {
            "type": "structural_tag",
            "structures": [{"begin": "<point>", "schema": POINT, "end": "</point>"}],
            "triggers": ["<point>"],
        },
        {
            "type": "structural_tag",
            "format": {
                "type": "tag",
                "begin": "<point>",
                "content": {"type": "json_schema", "json_schema": POINT},
                "end": "</point>",
            },
        },
    ],
    ids=["structures", "format"],
)
def test_a_structural_tag_holds_the_json_inside_its_tags(client, tag: dict) -> None:
    """The legacy form leaves text free until a trigger; the ``format`` form here is one tag and
    nothing else. Whatever the model writes, every tag's JSON is of its schema."""
    choice = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write the point (2, 3) as <point>JSON</point>."}],
        max_tokens=60,
        temperature=0,
        extra_body={"structured_outputs": {"structural_tag": json.dumps(tag)}},
    ).choices[0]
    assert validation(choice)["status"] in ("accepted", "truncated"), choice
    text = choice.message.content or ""
    if "format" in tag:
        assert choice.finish_reason == "stop" and text.startswith("<point>") and text.endswith("</point>"), text
    for body in text.split("<point>")[1:]:
        if "</point>" in body:
            jsonschema.validate(json.loads(body.split("</point>")[0]), POINT)


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_with_a_lark_grammar_is_called_with_input_the_grammar_accepts(client, stream: bool) -> None:
    request = dict(
        model=MODEL,
        messages=ASK,
        tools=[SQL_TOOL],
        tool_choice={"type": "custom", "custom": {"name": "sql"}},
        max_tokens=40,
        temperature=0,
    )
    if stream:
        pieces, last = [], None
        for chunk in client.chat.completions.create(**request, stream=True):
            for last in chunk.choices:
                pieces += last.delta.tool_calls or []
        # The SDK's delta type knows function calls only; a custom call's part is kept as an extra.
        first = pieces[0]
        assert first.type == "custom" and first.id and first.model_extra["custom"]["name"] == "sql", first
        assert all(p.id is None for p in pieces[1:])
        call_input = "".join(p.model_extra["custom"].get("input", "") for p in pieces)
        name, finish = "sql", last.finish_reason
    else:
        choice = client.chat.completions.create(**request).choices[0]
        [call] = choice.message.tool_calls
        assert call.type == "custom" and call.id
        name, call_input, finish, last = call.custom.name, call.custom.input, choice.finish_reason, choice
    assert finish == "tool_calls" and validation(last)["status"] == "accepted", last
    assert name == "sql" and parses(SQL, call_input), call_input


@pytest.mark.parametrize("stream", [False, True])
def test_the_responses_api_answers_a_custom_tool_with_a_custom_tool_call(client, stream: bool) -> None:
    request = dict(
        model=MODEL,
        input=ASK[0]["content"],
        tools=[{"type": "custom", "name": "sql", "format": {"type": "grammar", "syntax": "lark", "definition": SQL}}],
        tool_choice="required",
        max_output_tokens=40,
        temperature=0,
    )
    if stream:
        events = list(client.responses.create(**request, stream=True))
        deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert "".join(deltas) == done.input
        response = events[-1].response
    else:
        response = client.responses.create(**request)
    [item] = response.output
    assert item.type == "custom_tool_call" and item.name == "sql" and item.call_id, item
    assert response.status == "completed" and parses(SQL, item.input), item.input


@pytest.mark.parametrize(
    "request_fields, param",
    [
        ({"extra_body": {"structured_outputs": {"grammar": 'start: "a" missing'}}}, "structured_outputs.grammar"),
        ({"extra_body": {"grammar": "start: ::"}}, "grammar"),
        (
            {"extra_body": {"structured_outputs": {"structural_tag": '{"type": "structural_tag", "format": {}}'}}},
            "structured_outputs.structural_tag",
        ),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "custom": {
                            **SQL_TOOL["custom"],
                            "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: ("}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].custom.format.grammar.definition",
        ),
    ],
)
def test_a_bad_grammar_is_a_400_naming_the_field(client, request_fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, **request_fields)
    error = exc.value.body
    assert error["code"] == "invalid_grammar" and error["param"] == param, error
