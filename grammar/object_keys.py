"""Object layout: which keys the grammar generates, beyond what the schema allows.

Clients rarely write ``additionalProperties``: pydantic, instructor and LangChain send open objects,
and an open object lets a small model invent keys until ``max_tokens``. So the grammar follows
strict mode (OpenAI's, and vLLM's xgrammar default) where the schema is silent, while validation
still judges the schema as written:

- an object whose schema does not say ``additionalProperties`` (after ``allOf``/``$ref`` merging:
  no member says it) and lists properties generates only the listed ones (unless its
  ``minProperties`` needs more keys than it lists);
- ``minProperties``/``maxProperties`` stay in the grammar (both engines count keys) except on an
  open object with optional listed properties, where llguidance cannot count them: there they are
  reported ``validated_only``;
- an explicitly open object (``additionalProperties: true`` or a schema, ``patternProperties``, or
  an object that lists nothing) generates at most ``max_extra`` keys beyond those it lists, where
  the grammar can count them (no listed property, or all of them required: llguidance counts keys
  only then); a listed name is never generated as an extra key (both engines). A repeated key is
  beyond any grammar: ``tokenmold.grammar.guards.unique_keys`` is the runtime check for it, in the engine.

Every narrowing is recorded in the keyword report (``narrowed``), with its JSON Pointer in the
normalized schema. Two passes: ``mark_open`` runs on the caller's schema before normalization (it
rewrites ``additionalProperties: true`` to the equivalent ``{}``, which normalization keeps, so that
"said true" and "said nothing" stay apart), ``narrow_objects`` on the normalized schema.
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.json_pointer import pointer_token
from tokenmold.grammar.jsonschema.walk import DATA, MAPS, rewrite_schemas
from tokenmold.grammar.report import KeywordCoverage

#: Extra keys an explicitly open object may get, by default (``CompileOptions.max_extra_properties``).
DEFAULT_MAX_EXTRA_PROPERTIES = 8

_UNBOUNDED = (
    "extra keys never repeat nor reuse a listed name; their number is not bounded by the grammar "
    "here (it can count keys only when every listed property is required)"
)
_UNCOUNTED = "with optional properties is not enforced by the grammar; checked by validation"


def mark_open(schema: Any) -> Any:
    """``schema`` with every ``additionalProperties: true`` written ``{}`` (the same instances)."""
    return rewrite_schemas(schema, _said_open)


def _said_open(schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("additionalProperties") is True:
        schema["additionalProperties"] = {}
    return schema


def narrow_objects(schema: Any, report: KeywordCoverage, max_extra: int) -> Any:
    """The normalized ``schema`` with the layout above applied; notes go into ``report``."""
    return _Narrowing(report, max_extra).node(schema, "")


class _Narrowing:
    def __init__(self, report: KeywordCoverage, max_extra: int) -> None:
        self.report = report
        self.max_extra = max_extra

    def node(self, schema: Any, pointer: str) -> Any:
        if not isinstance(schema, dict):
            return schema
        out = {key: self.child(key, value, pointer) for key, value in schema.items()}
        if _is_object(out):
            self.object(out, pointer)
        return out

    def child(self, key: str, value: Any, pointer: str) -> Any:
        if key in DATA:
            return value
        if key in MAPS and isinstance(value, dict):
            return {name: self.node(sub, f"{pointer}/{key}/{pointer_token(name)}") for name, sub in value.items()}
        if isinstance(value, list):
            return [self.node(sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(value)]
        return self.node(value, f"{pointer}/{key}")

    def object(self, out: dict[str, Any], pointer: str) -> None:
        listed = out.get("properties", {})
        patterns = out.get("patternProperties", {})
        additional = out.get("additionalProperties")
        fits_closed = bool(patterns) or out.get("minProperties", 0) <= len(listed)
        if additional is None and (listed or patterns) and fits_closed:
            out["additionalProperties"] = additional = False
            self.report.narrow(
                pointer,
                "additionalProperties",
                "not stated: only the listed properties"
                + (" and keys matching patternProperties" if patterns else "")
                + " are generated (validation accepts others)",
            )
        if additional is False and not patterns:
            return
        required = set(out.get("required", ()))
        if listed and not required >= listed.keys():
            # llguidance counts the keys of an open object only when every listed one is required.
            for keyword in ("minProperties", "maxProperties"):
                if keyword in out:
                    del out[keyword]
                    self.report.validate_only(
                        f"{pointer}/{keyword}", keyword, f"{keyword} on an open object {_UNCOUNTED}"
                    )
            self.report.narrow(pointer, "additionalProperties", _UNBOUNDED)
            return
        bound = max(len(listed) + self.max_extra, out.get("minProperties", 0))
        if bound < out.get("maxProperties", bound + 1):
            out["maxProperties"] = bound
            self.report.narrow(
                pointer,
                "maxProperties",
                f"open object: at most {self.max_extra} keys beyond the {len(listed)} listed are generated",
            )


def opens_objects(report: KeywordCoverage) -> bool:
    """Whether the laid-out schema has an explicitly open object (its keys need the key guard)."""
    return any(note.keyword == "maxProperties" or note.reason == _UNBOUNDED for note in report.narrowed)


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind is None:
        return "properties" in schema or "additionalProperties" in schema
    return kind == "object" or (isinstance(kind, list) and "object" in kind)
