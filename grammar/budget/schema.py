"""What the budget-fitting tracker needs to know of a normalized schema, computed once per schema.

A value's schema is read as a list of *candidates*: ``$ref``s followed, ``anyOf``/``oneOf`` and
type lists spread out, so that each candidate holds one JSON type. The tracker narrows the list as
the output commits (the first byte of a value fixes its type; an object's keys rule out the
candidates that cannot hold them) and prices the rest by the cheapest candidate left.

A value not yet started is priced by its shortest instance (``tokenmold.grammar.budget.floor``'s
builder: required members only, ``minItems`` items, ``minLength`` characters, the shortest enum
member). Everything here is memoized by node identity: one ``FitSchema`` serves every request of a
shape, in the engine, for the life of the shape's grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmold.grammar.budget.floor import shortest_text
from tokenmold.grammar.json_layout import ARGUMENTS, COMPACT, JsonLayout
from tokenmold.grammar.json_pointer import read_token
from tokenmold.grammar.jsonschema.atoms import json_atom

#: JSON types, in the order a candidate with no ``type`` lists them.
_ALL_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
#: A ``$ref`` chain deeper than this is taken as a cycle (the tracker gives up on the value).
_MAX_REF_DEPTH = 32


class Untracked(Exception):
    """The schema says something the tracker does not follow; the budget is then left to the grammar."""


@dataclass(frozen=True, eq=False)
class Candidate:
    """One reading of a value's schema: a single JSON type and the keywords that apply to it.
    Compared and hashed by identity: ``FitSchema`` makes each once, and positions are cache keys."""

    kind: str
    schema: dict[str, Any]

    @property
    def values(self) -> list[Any] | None:
        """The allowed values when the schema lists them (``enum``/``const``), else ``None``."""
        if "const" in self.schema:
            return [self.schema["const"]]
        if "enum" in self.schema:
            return list(self.schema["enum"])
        return None


#: The key of a fit spec's schema that holds tool calls instead of one JSON value (``CallLayout``).
CALLS_KEY = "x-tokenmold-calls"


@dataclass(frozen=True)
class CallLayout:
    """Tool calls written around JSON arguments (``tokenmold.grammar.toolformats``' ``CallSyntax``):
    ``begins[i]`` opens a call of tool ``i`` (its arguments' schema is ``/tools/i`` of the root),
    ``end`` closes a call, ``separator`` comes between parallel calls, and the section's begin and
    end wrap all the calls of an answer (the first begin includes ``section_begin``).

    ``tool_choice: auto`` (calls optional): with ``trigger``, free text comes before a call and
    (parallel) between and after calls, and a call begins where the text ends with the trigger
    (``begins`` then continue it); with ``answer``, the output is the calls or one JSON value of
    the schema after the tools' (``/tools/<len(begins)>``), told apart by their first byte.

    The arguments are laid out in ``arguments`` (the grammar's layout for them, ``json_layout``); a
    JSON answer is compact, as without tools."""

    begins: tuple[bytes, ...]
    end: bytes
    separator: bytes
    section_begin: bytes
    section_end: bytes
    parallel: bool
    trigger: bytes = b""
    answer: bool = False
    arguments: JsonLayout = ARGUMENTS

    def to_json(self, arguments: list[Any], answer: Any = None) -> dict[str, Any]:
        """The spec's form: the arguments' schemas (and the answer's, last; their ``$ref``s made
        absolute) and the texts."""
        texts = {k: getattr(self, k).decode() for k in _TEXTS}
        layout = {
            "begins": [b.decode() for b in self.begins],
            "parallel": self.parallel,
            "answer": self.answer,
            "arguments": list(self.arguments),
        }
        schemas = [*arguments, answer] if self.answer else arguments
        return {CALLS_KEY: layout | texts, "tools": [_rebase(a, f"#/tools/{i}") for i, a in enumerate(schemas)]}

    @classmethod
    def from_json(cls, root: dict[str, Any]) -> CallLayout:
        layout = root[CALLS_KEY]
        texts = {k: layout.get(k, "").encode() for k in _TEXTS}
        begins = tuple(b.encode() for b in layout["begins"])
        arguments = JsonLayout(*layout.get("arguments", ARGUMENTS))
        return cls(begins, parallel=layout["parallel"], answer=bool(layout.get("answer")), arguments=arguments, **texts)


#: The texts of a ``CallLayout``, as its spec form names them.
_TEXTS = ("end", "separator", "section_begin", "section_end", "trigger")


class FitSchema:
    """A normalized schema, resolved and priced lazily (see the module docstring). A root holding
    ``CALLS_KEY`` is tool calls: ``calls`` is their layout."""

    def __init__(self, root: dict[str, Any] | bool) -> None:
        self.root: dict[str, Any] = root if isinstance(root, dict) else {}
        if root is False:
            raise Untracked("the schema admits nothing")
        self.calls = CallLayout.from_json(self.root) if CALLS_KEY in self.root else None
        self._candidates: dict[int, tuple[Candidate, ...]] = {}
        self._floors: dict[tuple[int, JsonLayout], str] = {}
        self._keep: list[Any] = []  # keeps memoized nodes alive, so their ids stay theirs

    def candidates(self, schema: Any) -> tuple[Candidate, ...]:
        """The candidates of ``schema`` (a subschema of the root, or ``True``)."""
        key = id(schema)
        found = self._candidates.get(key)
        if found is None:
            found = tuple(self._spread(schema, 0))
            self._candidates[key] = found
            self._keep.append(schema)
        return found

    def layout_of(self, tool: int) -> JsonLayout:
        """The layout of the JSON value at the root (``tool`` -1) or of ``/tools/<tool>``: a tool's
        arguments in the calls' layout, a JSON answer compact."""
        calls = self.calls
        return calls.arguments if calls is not None and 0 <= tool < len(calls.begins) else COMPACT

    def floor(self, schema: Any, layout: JsonLayout = COMPACT) -> str:
        """The shortest instance of ``schema`` written in ``layout`` (``0`` where none can be built)."""
        key = (id(schema), layout)
        found = self._floors.get(key)
        if found is None:
            found = shortest_text(self.root, schema, layout) or "0"
            self._floors[key] = found
            self._keep.append(schema)
        return found

    def _spread(self, schema: Any, depth: int) -> list[Candidate]:
        if depth > _MAX_REF_DEPTH:
            raise Untracked("$ref cycle")
        if schema is True or schema is None:
            schema = {}
        if schema is False:
            return []
        if not isinstance(schema, dict):
            raise Untracked(f"schema {schema!r}")
        if "$ref" in schema:
            return self._spread(self._resolve(schema["$ref"]), depth + 1)
        if "allOf" in schema:
            raise Untracked("allOf left after normalization")
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return [c for branch in schema[keyword] for c in self._spread(branch, depth + 1)]
        values = Candidate("any", schema).values
        if values is not None:
            kinds = sorted({_kind_of(v) for v in values})
            return [Candidate(kind, {**schema, "enum": [v for v in values if _kind_of(v) == kind]}) for kind in kinds]
        declared = schema.get("type")
        kinds = [declared] if isinstance(declared, str) else list(declared or _ALL_TYPES)
        return [Candidate(kind, schema) for kind in kinds]

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise Untracked(f"remote $ref {ref}")
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = read_token(part)
            if not isinstance(node, dict) or part not in node:
                raise Untracked(f"unresolved $ref {ref}")
            node = node[part]
        return node


def _rebase(schema: Any, base: str) -> Any:
    """``schema`` with its local ``$ref``s pointing under ``base`` (its place in a larger root)."""
    if isinstance(schema, list):
        return [_rebase(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebase(v, base) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    return out


def _kind_of(value: Any) -> str:
    atom = json_atom(value)
    return "number" if atom == "fraction" else atom


def first_byte_kinds(byte: int) -> tuple[str, ...]:
    """The JSON types a value starting with ``byte`` can have."""
    char = chr(byte)
    if char == '"':
        return ("string",)
    if char == "{":
        return ("object",)
    if char == "[":
        return ("array",)
    if char == "-" or char.isdigit():
        return ("number", "integer")
    if char in "tf":
        return ("boolean",)
    if char == "n":
        return ("null",)
    return ()
