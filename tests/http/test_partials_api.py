"""Validated partial streaming on the shared live ``tokenmold serve``, through the openai SDK's
streams: each closed member and element arrives judged in ``choices[].delta.partials`` (and as
``response.output_json.partial`` events), ``stop_on_invalid`` ends a generation at its first
invalid part, and the fields are refused where they cannot apply."""

from __future__ import annotations

import json

import openai
import pytest
from support.closed_parts import parts_of
from support.live_api import MODEL

pytestmark = pytest.mark.engine

BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "author": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "born": {"type": "integer", "minimum": 1000, "maximum": 2030},
            },
            "required": ["name", "born"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3},
    },
    "required": ["title", "author", "tags"],
    "additionalProperties": False,
}
ASK_BOOK = [{"role": "user", "content": "Describe the novel Dune as JSON: title, author (name, born) and tags."}]

#: A short answer with a member, an array and its elements.
CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2, "maxItems": 2},
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}

#: The second element must be three booleans that are all different: ``uniqueItems``, which only
#: validation checks (the grammar cannot), makes every such element invalid, and the array needs a
#: third element before it may close.
ROWS = {
    "type": "object",
    "properties": {
        "rows": {
            "type": "array",
            "prefixItems": [{"type": "string", "maxLength": 8}],
            "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3, "uniqueItems": True},
            "minItems": 3,
            "maxItems": 3,
        }
    },
    "required": ["rows"],
    "additionalProperties": False,
}


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def test_each_closed_value_arrives_judged_before_the_answer_ends(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK_BOOK,
        max_tokens=120,
        temperature=0,
        stream=True,
        response_format=_format(BOOK),
        extra_body={"partials": True},
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    answer = json.loads("".join(c.choices[0].delta.content or "" for c in chunks))
    assert chunks[-1].choices[0].model_extra["validation"]["status"] == "accepted"
    arrived = [(i, part) for i, c in enumerate(chunks) for part in c.choices[0].delta.model_extra.get("partials") or []]
    expected = parts_of(answer)
    assert [part["pointer"] for _, part in arrived] == list(expected)  # one per closed value, in closing order
    assert all(part["value"] == expected[part["pointer"]] for _, part in arrived)
    assert all(part["status"] == "accepted" and part["errors"] == [] for _, part in arrived)
    assert arrived[0][0] < len(chunks) * 2 / 3
    # Asked for nothing, a stream has no partials at all, though a member closes.
    small = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    plain = client.chat.completions.create(
        model=MODEL, messages=ASK_BOOK, max_tokens=12, stream=True, response_format=_format(small)
    )
    assert not any(c.choices and "partials" in (c.choices[0].delta.model_extra or {}) for c in plain)


def test_stop_on_invalid_ends_at_the_invalid_element_before_the_array_closes(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A label, then rows of yes/no flags, as JSON."}],
        max_tokens=120,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        response_format=_format(ROWS),
        extra_body={"partials": True, "stop_on_invalid": True},
    )
    chunks = list(stream)
    choices = [c.choices[0] for c in chunks if c.choices]
    parts = [part for choice in choices for part in choice.delta.model_extra.get("partials") or []]
    assert [part["pointer"] for part in parts if part["status"] == "invalid"] == ["/rows/1"]
    assert "/rows" not in [part["pointer"] for part in parts]  # the array never closed
    check = choices[-1].model_extra["validation"]
    assert choices[-1].finish_reason == "stop" and check["status"] == "invalid"
    assert check["stop_reason"] == "invalid_part"
    assert [(e["path"], e["keyword"]) for e in check["errors"][:2]] == [
        ("/rows/1", "stop_on_invalid"),
        ("/rows/1", "uniqueItems"),
    ]
    usage = chunks[-1].usage
    assert usage is not None and usage.model_extra["unspent_tokens"] == 120 - usage.completion_tokens > 0


def test_a_responses_stream_carries_partials_as_their_own_events(client) -> None:
    with client.responses.stream(  # the SDK's helper passes an event type it does not know through
        model=MODEL,
        input="A cat's name and two tags, as JSON.",
        max_output_tokens=64,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "cat", "schema": CAT}},
        extra_body={"partials": True},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    parts = [part for e in events if e.type == "response.output_json.partial" for part in e.model_extra["partials"]]
    assert events[-1].type == "response.completed" and final.output_text
    expected = parts_of(json.loads(final.output_text))
    assert [(p["pointer"], p["value"]) for p in parts] == list(expected.items())


@pytest.mark.parametrize(
    "fields, param, fragment",
    [
        ({"partials": True}, "partials", "needs stream: true"),
        ({"stop_on_invalid": True, "stream": True, "regex": "a+"}, "stop_on_invalid", "needs a JSON answer"),
    ],
)
def test_partials_are_refused_where_they_cannot_apply(client, fields, param, fragment) -> None:
    stream = fields.pop("stream", False)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=ASK_BOOK, max_tokens=8, stream=stream, extra_body=fields)
    assert refused.value.body["param"] == param and fragment in refused.value.body["message"]
