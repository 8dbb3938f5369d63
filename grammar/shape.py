"""One value type for every kind of output shape a caller can ask for.

A ``Shape`` is what the caller meant, before normalization: the JSON Schema as given (dict or text),
a pydantic model (kept so the validation layer can run it), an EBNF or Lark grammar, an xgrammar
structural tag, a regex, a choice list, or a set of callable tools (``tokenmold.grammar.tools.ToolCalls``).
Constructors check only the form of the input; everything semantic happens in ``normalize`` and ``compiler``.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from tokenmold.grammar.dialect import Dialect, grammar_dialect
from tokenmold.grammar.errors import SchemaError, ShapeError
from tokenmold.grammar.json_layout import JsonLayout
from tokenmold.grammar.structural_tag import read_structural_tag
from tokenmold.grammar.toolformats import HERMES, ToolFormat
from tokenmold.grammar.tools import Tool, ToolCalls


class ShapeKind(str, enum.Enum):
    JSON_SCHEMA = "json_schema"
    EBNF = "ebnf"
    REGEX = "regex"
    CHOICE = "choice"
    TOOLS = "tools"
    LARK = "lark"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True)
class Shape:
    """An output shape. Build it with one of the ``from_*`` constructors."""

    kind: ShapeKind
    #: JSON Schema (as a dict) for JSON_SCHEMA; the grammar/regex text; the choices; a ToolCalls; the
    #: structural tag (a dict).
    source: Any
    #: The pydantic model class a JSON_SCHEMA shape came from, if any (validated after the schema).
    pydantic_model: type | None = field(default=None, compare=False)

    @classmethod
    def from_json_schema(cls, schema: dict[str, Any] | bool | str | bytes) -> Shape:
        """A JSON Schema given as a dict, a boolean schema, or JSON text."""
        if isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise SchemaError(f"schema is not valid JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from None
        if not isinstance(schema, (dict, bool)):
            raise SchemaError(
                f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}",
                pointer="",
            )
        return cls(ShapeKind.JSON_SCHEMA, schema)

    @classmethod
    def from_pydantic(cls, model: type) -> Shape:
        """A pydantic v2 model class; its JSON Schema is generated, the class kept for validation."""
        schema_fn = getattr(model, "model_json_schema", None)
        if not callable(schema_fn):
            raise ShapeError(f"{model!r} is not a pydantic v2 model class")
        return cls(ShapeKind.JSON_SCHEMA, schema_fn(), pydantic_model=model)

    @classmethod
    def from_ebnf(cls, grammar: str) -> Shape:
        """An EBNF grammar in xgrammar's (GBNF-like) dialect, rooted at ``root``."""
        if not isinstance(grammar, str) or not grammar.strip():
            raise ShapeError("an EBNF grammar must be a non-empty string")
        return cls(ShapeKind.EBNF, grammar)

    @classmethod
    def from_lark(cls, grammar: str) -> Shape:
        """A Lark grammar in llguidance's dialect, rooted at ``start``."""
        if not isinstance(grammar, str) or not grammar.strip():
            raise ShapeError("a Lark grammar must be a non-empty string")
        return cls(ShapeKind.LARK, grammar)

    @classmethod
    def from_grammar(cls, grammar: str) -> Shape:
        """A grammar in either dialect, told apart by ``tokenmold.grammar.dialect``'s rule (the
        ``grammar`` request fields, which name no dialect)."""
        if isinstance(grammar, str) and grammar_dialect(grammar) is Dialect.EBNF:
            return cls.from_ebnf(grammar)
        return cls.from_lark(grammar)

    @classmethod
    def from_structural_tag(cls, tag: str | dict[str, Any]) -> Shape:
        """An xgrammar structural tag (``tokenmold.grammar.structural_tag``), as JSON text or a dict."""
        return cls(ShapeKind.STRUCTURAL_TAG, read_structural_tag(tag))

    @classmethod
    def from_regex(cls, pattern: str) -> Shape:
        """A regular expression that the whole output must match."""
        if not isinstance(pattern, str):
            raise ShapeError("a regex must be a string")
        return cls(ShapeKind.REGEX, pattern)

    @classmethod
    def from_choice(cls, choices: list[str] | tuple[str, ...]) -> Shape:
        """The output must be exactly one of the given strings."""
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ShapeError("a choice list must be a non-empty list of non-empty strings")
        return cls(ShapeKind.CHOICE, tuple(choices))

    @classmethod
    def from_tools(
        cls,
        tools: list[Tool] | tuple[Tool, ...],
        *,
        required: bool,
        parallel: bool,
        tool_format: ToolFormat = HERMES,
        answer: dict[str, Any] | bool | None = None,
        answer_strict: bool = False,
        arguments_layout: JsonLayout | None = None,
    ) -> Shape:
        """Tool calls written in ``tool_format`` (``tokenmold.grammar.toolformats``): with
        ``required``, one call or more (``parallel``) and nothing else; without, free text in which
        calls may appear, or with an ``answer`` schema, calls or one JSON value of that schema;
        ``arguments_layout`` (``ToolCalls``): the arguments as the model writes them, or one layout."""
        calls = ToolCalls(
            tuple(tools),
            required=required,
            parallel=parallel,
            tool_format=tool_format,
            answer=answer,
            answer_strict=answer_strict,
            arguments_layout=arguments_layout,
        )
        return cls(ShapeKind.TOOLS, calls)

    @property
    def is_json(self) -> bool:
        return self.kind is ShapeKind.JSON_SCHEMA

    def source_text(self) -> str:
        """Canonical text of the source (see ``source_bytes``)."""
        return self.source_bytes.decode()

    @cached_property
    def source_bytes(self) -> bytes:
        """Canonical UTF-8 text of the source: the key material for caching and size limits.

        Keys keep their order: the order of ``properties`` is the order the grammar generates them
        in, so two schemas that differ only there are different shapes.
        """
        if self.kind is ShapeKind.JSON_SCHEMA:
            return canonical_json(self.source)
        if self.kind is ShapeKind.CHOICE:
            return canonical_json(list(self.source))
        if self.kind is ShapeKind.TOOLS:
            return canonical_json(self.source.as_dict())
        if self.kind is ShapeKind.STRUCTURAL_TAG:
            return canonical_json(self.source)
        return str(self.source).encode()


def canonical_json(value: Any) -> bytes:
    """Compact JSON with keys in document order, one text per distinct value.

    orjson writes a large tool set's schemas an order of magnitude faster than ``json``, whose time
    would be most of a cached tool set's (docs/design.md); it writes NaN and infinities as
    ``null``, so a text with ``null`` in it is checked for them and written by ``json`` (which
    keeps them apart) when there are any.
    """
    try:
        text = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # integers beyond 64 bits, odd key types
        text = b""
    if not text or (b"null" in text and _has_non_finite(value)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return text


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False
