"""xgrammar's structural tags, in the two forms vLLM 0.32 accepts in ``structured_outputs.structural_tag``.

- the legacy form ``{"type": "structural_tag", "structures": [{"begin", "schema", "end"}, ...],
  "triggers": [...]}``: free text in which each trigger opens one of the structures, whose content
  is JSON of its schema;
- xgrammar's ``{"type": "structural_tag", "format": {...}}``, a tree of formats (``tag``,
  ``triggered_tags``, ``sequence``, ``json_schema``, ``any_text``...).

xgrammar compiles both (``Grammar.from_structural_tag``, which checks the tree with its own pydantic
models); this module only checks the outer form, so that a body that is not a structural tag at all
is told so by name, and lists the tags whose content is JSON of a schema, which validation checks
in the output (the grammar holds the JSON's form; jsonschema judges what the grammar cannot).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.errors import GrammarSyntaxError


@dataclass(frozen=True)
class SchemaTag:
    """A tag whose content is one JSON value of ``schema``: ``begin`` JSON and one of ``ends``."""

    begin: str
    ends: tuple[str, ...]
    schema: dict[str, Any] | bool


def read_structural_tag(value: str | dict[str, Any]) -> dict[str, Any]:
    """The structural tag as a dict, its outer form checked; a ``GrammarSyntaxError`` otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarSyntaxError(
                f"the structural tag is not valid JSON: {exc.msg}", line=exc.lineno, column=exc.colno
            ) from None
    if not isinstance(value, dict) or value.get("type", "structural_tag") != "structural_tag":
        raise GrammarSyntaxError('a structural tag is a JSON object with "type": "structural_tag"')
    if "structures" in value:
        structures, triggers = value.get("structures"), value.get("triggers")
        if not isinstance(structures, list) or not structures or not all(_is_structure(s) for s in structures):
            raise GrammarSyntaxError(
                'structures must be a non-empty list of {"begin": str, "schema": object, "end": str}'
            )
        if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise GrammarSyntaxError("triggers must be a non-empty list of non-empty strings")
        try:
            read = [{**s, "schema": _schema(s["schema"])} for s in structures]
        except json.JSONDecodeError as exc:
            raise GrammarSyntaxError(f"a structure's schema is not valid JSON: {exc.msg}") from None
        return {**value, "type": "structural_tag", "structures": read}
    if not isinstance(value.get("format"), dict):
        raise GrammarSyntaxError('a structural tag has a "format" object (or the legacy "structures" and "triggers")')
    return {**value, "type": "structural_tag"}


def _is_structure(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("begin"), str)
        and isinstance(item.get("end"), str)
        and isinstance(item.get("schema"), (dict, bool, str))
    )


def schema_tags(tag: dict[str, Any]) -> tuple[SchemaTag, ...]:
    """The tags of a (checked) structural tag whose content is JSON of a schema, in either form."""
    if "structures" in tag:
        return tuple(SchemaTag(s["begin"], (s["end"],), s["schema"]) for s in tag["structures"])
    return tuple(_walk(tag["format"]))


def _walk(node: Any) -> Iterator[SchemaTag]:
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
        return
    if not isinstance(node, dict):
        return
    content = node.get("content")
    if node.get("type") == "tag" and isinstance(content, dict) and content.get("type") == "json_schema":
        begin, end = node.get("begin"), node.get("end")
        ends = (end,) if isinstance(end, str) else tuple(end) if isinstance(end, list) else ()
        schema = content.get("json_schema", True)
        # Tags written as token ids are not found in text; their content stays the grammar's alone.
        if (
            isinstance(begin, str)
            and ends
            and all(isinstance(e, str) for e in ends)
            and isinstance(schema, (dict, bool))
        ):
            yield SchemaTag(begin, ends, schema)
            return
    for child in node.values():
        yield from _walk(child)


def _schema(schema: Any) -> Any:
    """A legacy structure's schema may be JSON text (xgrammar reads it so too)."""
    return json.loads(schema) if isinstance(schema, str) else schema
