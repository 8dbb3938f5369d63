"""The requests the repetition benchmark sends, in three groups, each as the runtime gets it.

- ``json``: one answer per sampled MaskBench schema (the schema in the prompt, the grammar
  applied), and a few answers that repeat on purpose (equal numbers, a grid, equal objects), which
  the guard must leave alone.
- ``tools``: BFCL's single-turn questions (``bfcl_tasks``: ``simple``, ``multiple``, ``parallel``,
  ``parallel_multiple``), each with ``tool_choice`` ``required`` (the arguments' JSON) and ``auto``
  (free text or calls), as chat requests go through the server (``chat_plan``: the tools written
  into the prompt and the shape in the model's tool-call format).
- ``grammar``: EBNF, Lark, regex, structural-tag and custom-tool answers, as chat requests too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bfcl_tasks import load_tasks, openai_tool
from benchmarks.corpus import load_case
from tokenmold.grammar import Shape
from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.service.api.translate import chat_plan
from tokenmold.service.engine.model_info import ModelInfo
from tokenmold.service.request.runtime import Prompt

#: Schemas longer than this (as JSON text) are left out: the prompt must fit the context.
MAX_SCHEMA_CHARS = 1500


@dataclass(frozen=True)
class BenchRequest:
    """One request of the benchmark."""

    name: str
    #: ``json``, ``tools`` or ``grammar``.
    group: str
    prompt: Prompt
    shape: Shape


def json_requests(paths: list[Path]) -> list[BenchRequest]:
    """MaskBench's schemas, then the answers that repeat on purpose."""
    requests = []
    for path in paths:
        schema = load_case(path).schema
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            continue
        prompt = Prompt.user(f"Write one realistic JSON value that fits this JSON Schema:\n{text}")
        requests.append(BenchRequest(path.name, "json", prompt, Shape.from_json_schema(schema)))
    for name, ask, schema in _ON_PURPOSE:
        prompt = Prompt.user(f"{ask} Answer with JSON that fits this JSON Schema:\n{json.dumps(schema)}")
        requests.append(BenchRequest(name, "json", prompt, Shape.from_json_schema(schema)))
    return requests


_NUMBERS = {"type": "array", "items": {"type": "integer"}}
_GRID = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
_ITEM = {
    "type": "object",
    "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
    "required": ["sku", "quantity", "price"],
}
_DAY = {"type": "object", "properties": {"open": {"type": "string"}, "close": {"type": "string"}}}
#: Answers whose right content repeats: (name, question, schema).
_ON_PURPOSE: list[tuple[str, str, dict[str, Any]]] = [
    ("zeros", "Write an array of thirty zeros.", _NUMBERS),
    ("ones", "A histogram where every one of the 24 hours counts 1.", _NUMBERS),
    ("grid", "An empty 8 by 8 board: every cell is 0.", _GRID),
    (
        "order",
        "An order of four identical items, SKU A-100, quantity 1, price 9.99 each.",
        {"type": "array", "items": _ITEM},
    ),
    (
        "week",
        "Opening hours of a shop open 09:00 to 17:00 every day of the week.",
        {"type": "object", "properties": {d: _DAY for d in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")}},
    ),
]


def tool_requests(model: ModelInfo, per_category: int, seed: int) -> list[BenchRequest]:
    """BFCL's questions with their functions as strict tools, ``required`` and ``auto``."""
    requests = []
    for task in load_tasks(per_category, seed):
        tools = [openai_tool(function, strict=True) for function in task.functions]
        for choice in ("required", "auto"):
            body = {"messages": task.messages, "tools": tools, "tool_choice": choice}
            requests.append(_chat(model, f"{task.id}:{choice}", "tools", body))
    return requests


def grammar_requests(model: ModelInfo) -> list[BenchRequest]:
    """EBNF, Lark, regex, structural-tag and custom-tool answers."""
    return [
        _chat(model, name, "grammar", {"messages": [{"role": "user", "content": ask}], **fields})
        for name, ask, fields in _GRAMMARS
    ]


_SQL = (
    'start: "SELECT " NAME ("," " "? NAME)* " FROM " NAME (" WHERE " NAME " = " VALUE)?\n'
    "NAME: /[a-z_]{1,16}/\nVALUE: /[0-9]+/ | /'[a-z ]{1,20}'/"
)
_CONFIG = 'start: line+\nline: KEY "=" VALUE "\\n"\nKEY: /[a-z_]{1,20}/\nVALUE: /[a-zA-Z0-9_.]{1,30}/'
_BULLETS = 'start: item+\nitem: "- " TEXT "\\n"\nTEXT: /[A-Za-z ,]{1,60}/'
_EXPR = 'root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= factor ([*/] factor)*\nfactor ::= [0-9]+ | "(" expr ")"'
_CSV = 'root ::= "name,age,city\\n" row ("\\n" row)*\nrow ::= [A-Za-z ]+ "," [0-9]+ "," [A-Za-z ]+'
_DATES = 'root ::= date (", " date)*\ndate ::= [0-9] [0-9] [0-9] [0-9] "-" [0-9] [0-9] "-" [0-9] [0-9]'
_POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}
_WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<function=get_weather>", "schema": _WEATHER, "end": "</function>"}],
    "triggers": ["<function="],
}
_POINT_TAG = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<point>",
        "content": {"type": "json_schema", "json_schema": _POINT},
        "end": "</point>",
    },
}


def _custom(name: str, syntax: str, definition: str) -> dict[str, Any]:
    grammar = {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}}
    return {
        "tools": [{"type": "custom", "custom": {"name": name, "format": grammar}}],
        "tool_choice": {"type": "custom", "custom": {"name": name}},
    }


#: (name, question, the request's shape fields).
_GRAMMARS: list[tuple[str, str, dict[str, Any]]] = [
    ("ebnf-expression", "Write an arithmetic expression that equals 24.", {"grammar": _EXPR}),
    ("ebnf-csv", "List three people as CSV rows: name, age, city.", {"grammar": _CSV}),
    ("ebnf-dates", "List the dates of the first five days of March 2024.", {"grammar": _DATES}),
    ("lark-sql", "Get the names and emails of all users older than 30.", {"structured_outputs": {"grammar": _SQL}}),
    (
        "lark-config",
        "Write a config for a web server: host, port, workers, log level.",
        {"structured_outputs": {"grammar": _CONFIG}},
    ),
    ("lark-bullets", "Give five tips for writing clear emails.", {"structured_outputs": {"grammar": _BULLETS}}),
    ("regex-phone", "What is the phone number of the White House?", {"regex": r"\(\d{3}\) \d{3}-\d{4}"}),
    ("regex-squares", "List the first ten square numbers.", {"regex": r"\d+(, \d+)*"}),
    ("regex-sentence", "Describe the ocean in one sentence.", {"regex": r"[A-Z][a-z ,']*\."}),
    ("regex-count", "Count from one to twenty, in digits, separated by spaces.", {"regex": r"\d+( \d+)*"}),
    ("regex-email", "Make up an email address for Grace Hopper.", {"regex": r"[a-z0-9._]+@[a-z]+\.[a-z]{2,3}"}),
    (
        "tag-weather",
        "What's the weather in Paris? Call <function=get_weather>{JSON}</function>.",
        {"structured_outputs": {"structural_tag": json.dumps(_TAG)}},
    ),
    (
        "tag-point",
        "Write the point (2, 3) as <point>JSON</point>.",
        {"structured_outputs": {"structural_tag": json.dumps(_POINT_TAG)}},
    ),
    ("custom-sql", "Get the names of all users.", _custom("sql", "lark", _SQL)),
    ("custom-zip", "What is the ZIP code of Beverly Hills?", _custom("zip", "regex", r"\d{5}(-\d{4})?")),
]


def _chat(model: ModelInfo, name: str, group: str, body: dict[str, Any]) -> BenchRequest:
    plan = chat_plan(ChatCompletionRequest.model_validate({"model": "bench", **body}), model)
    assert plan.shape is not None, name
    return BenchRequest(name, group, plan.prompt, plan.shape)
