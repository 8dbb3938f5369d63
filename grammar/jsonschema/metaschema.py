"""The metaschema check, fast: keyword shapes and size limits, with the pointer of each fault."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jsonschema import validators
from jsonschema.protocols import Validator

from tokenmold.grammar.errors import LimitExceeded, SchemaError, UnsupportedFeature
from tokenmold.grammar.json_pointer import pointer_token
from tokenmold.grammar.jsonschema.regex import PatternError, compile_pattern
from tokenmold.grammar.limits import Limits

LEGACY_REF = (validators.Draft4Validator, validators.Draft6Validator, validators.Draft7Validator)
_TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_SCHEMA = (
    "not",
    "if",
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "items",
)
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAP = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
_COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_NUMBERS = ("minimum", "maximum", "multipleOf")


#: A validator class (``Draft202012Validator``, ...): the draft, with its vocabulary.
Draft = type[Validator]


def draft_of(schema: dict[str, Any]) -> Draft:
    """The validator class of the schema's ``$schema`` (Draft 2020-12 when absent or unknown)."""
    uri = schema.get("$schema")
    if uri is not None and not isinstance(uri, str):
        raise SchemaError("$schema must be a string", pointer="/$schema", keyword="$schema")
    draft: Draft = validators.validator_for(schema, default=validators.Draft202012Validator)
    if draft is validators.Draft3Validator:
        raise UnsupportedFeature("draft-03 schemas are not supported", pointer="/$schema", keyword="$schema")
    return draft


class Checker:
    """Keyword shapes and size limits, with pointers: the metaschema check, fast.

    ``check_schema`` of jsonschema costs more than the rest of normalization for a typical
    MaskBench schema. This walk checks what the validator and the
    normalizer rely on: every schema position holds a schema, every known keyword's value has its
    type, ``type`` names exist, patterns compile. It also records anchors for ``$ref``.
    """

    def __init__(self, draft: Draft, limits: Limits) -> None:
        self.known = frozenset(draft.VALIDATORS)
        self.items_array = draft is not validators.Draft202012Validator
        self.boolean_exclusive = draft is validators.Draft4Validator
        self.limits = limits
        self.anchors: dict[str, tuple[Any, str]] = {}
        self.checked: set[int] = set()
        self.total_properties = 0
        #: Every ``$ref`` met, with the pointer of its schema: local ones must all resolve.
        self.refs: list[tuple[str, str]] = []
        self._handlers = self._handlers_for(draft)

    def _handlers_for(self, draft: Draft) -> dict[str, Callable[[Any, str, str], None]]:
        """The check of each keyword this draft knows (plus its definitions container)."""
        handlers: dict[str, Callable[[Any, str, str], None]] = {}
        for key in self.known | {"definitions" if draft in LEGACY_REF else "$defs"}:
            if key in _SCHEMA:
                handlers[key] = self._subschema
            elif key in _SCHEMA_LIST:
                handlers[key] = self._schema_list
            elif key in _SCHEMA_MAP:
                handlers[key] = self._schema_map
            else:
                handlers[key] = self._value
        if "if" in self.known:  # then/else and min/maxContains ride on "if" and "contains"
            handlers["then"] = handlers["else"] = self._subschema
        if "contains" in self.known:
            handlers["minContains"] = handlers["maxContains"] = self._value
        return handlers

    def check(self, node: Any, pointer: str, keyword: str | None) -> None:
        if node is True or node is False:
            return
        if not isinstance(node, dict):
            raise SchemaError("a schema must be an object or a boolean", pointer=pointer, keyword=keyword)
        if id(node) in self.checked:
            return
        self.checked.add(id(node))
        if not node.keys().isdisjoint(("$anchor", "$id", "id")):
            self._anchor(node, pointer)
        handlers = self._handlers
        for key, value in node.items():
            if key in handlers:
                handlers[key](value, f"{pointer}/{key}", key)

    def _anchor(self, node: dict[str, Any], pointer: str) -> None:
        for key in ("$anchor", "$id", "id"):
            value = node.get(key)
            if isinstance(value, str) and (key == "$anchor" or value.startswith("#")):
                self.anchors.setdefault(value.lstrip("#"), (node, pointer))

    def _subschema(self, value: Any, pointer: str, key: str) -> None:
        if key == "items" and isinstance(value, list) and self.items_array:
            self._schema_list(value, pointer, key)
        else:
            self.check(value, pointer, key)

    def _schema_list(self, value: Any, pointer: str, key: str) -> None:
        if not isinstance(value, list) or not value:
            raise SchemaError(f"{key} must be a non-empty array of schemas", pointer=pointer, keyword=key)
        for index, sub in enumerate(value):
            self.check(sub, f"{pointer}/{index}", key)

    def _schema_map(self, value: Any, pointer: str, key: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(f"{key} must be an object of schemas", pointer=pointer, keyword=key)
        if key == "properties":
            self._count_properties(len(value), pointer)
        for name, sub in value.items():
            if key == "patternProperties":
                self._pattern(name, f"{pointer}/{pointer_token(name)}", key)
            self.check(sub, f"{pointer}/{pointer_token(name)}", key)

    def _count_properties(self, count: int, pointer: str) -> None:
        if count > self.limits.max_properties:
            raise LimitExceeded(
                f"{count} properties in one object; the limit is {self.limits.max_properties}",
                pointer=pointer,
                keyword="max_properties",
            )
        self.total_properties += count
        if self.total_properties > self.limits.max_total_properties:
            raise LimitExceeded(
                f"more than {self.limits.max_total_properties} properties in the schema",
                pointer=pointer,
                keyword="max_total_properties",
            )

    def _value(self, value: Any, pointer: str, key: str) -> None:
        """Check the value of a keyword that holds data, not subschemas."""
        if key == "type":
            names = value if isinstance(value, list) else [value]
            if not names or not all(isinstance(name, str) and name in _TYPE_NAMES for name in names):
                raise SchemaError(
                    f"unknown type {value!r}; types are {sorted(_TYPE_NAMES)}", pointer=pointer, keyword=key
                )
        elif key == "enum":
            self._enum(value, pointer)
        elif key in ("required", "dependentRequired", "dependencies"):
            self._names(key, value, pointer)
        elif key in _COUNTS:
            self._count(key, value, pointer)
        elif key in _NUMBERS or (key.startswith("exclusiveM") and not self.boolean_exclusive):
            if not _is_number(value) or (key == "multipleOf" and value <= 0):
                raise SchemaError(
                    f"{key} must be a {'positive ' if key == 'multipleOf' else ''}finite number",
                    pointer=pointer,
                    keyword=key,
                )
        elif key in ("pattern", "format", "$ref", "$dynamicRef", "$recursiveRef") and not isinstance(value, str):
            raise SchemaError(f"{key} must be a string", pointer=pointer, keyword=key)
        elif key == "pattern":
            self._pattern(value, pointer, key)
        elif key == "$ref":
            self.refs.append((value, pointer[: -len("/$ref")]))
        elif key in ("$dynamicRef", "$recursiveRef"):
            raise UnsupportedFeature(f"{key} is not supported; use $ref", pointer=pointer, keyword=key)
        elif key == "uniqueItems" and not isinstance(value, bool):
            raise SchemaError("uniqueItems must be a boolean", pointer=pointer, keyword=key)

    def _enum(self, value: Any, pointer: str) -> None:
        if not isinstance(value, list):
            raise SchemaError("enum must be an array", pointer=pointer, keyword="enum")
        if len(value) > self.limits.max_enum_values:
            raise LimitExceeded(
                f"enum has {len(value)} values; the limit is {self.limits.max_enum_values}",
                pointer=pointer,
                keyword="max_enum_values",
            )

    def _names(self, key: str, value: Any, pointer: str) -> None:
        """``required`` is an array of names; ``dependentRequired``/``dependencies`` map to them."""
        if key == "required":
            if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
                raise SchemaError("required must be an array of property names", pointer=pointer, keyword=key)
            return
        if not isinstance(value, dict):
            raise SchemaError(f"{key} must be an object", pointer=pointer, keyword=key)
        for name, sub in value.items():
            where = f"{pointer}/{pointer_token(name)}"
            if isinstance(sub, list) and all(isinstance(item, str) for item in sub):
                continue
            if key == "dependencies":
                self.check(sub, where, key)
            else:
                raise SchemaError(f"{key} values must be arrays of property names", pointer=where, keyword=key)

    def _count(self, key: str, value: Any, pointer: str) -> None:
        if not _is_number(value) or value < 0 or not float(value).is_integer():
            raise SchemaError(f"{key} must be a non-negative integer", pointer=pointer, keyword=key)
        if key.startswith("min") and key != "minContains" and value > self.limits.max_repeat:
            raise LimitExceeded(
                f"{key} {int(value)} exceeds max_repeat {self.limits.max_repeat}: no sensible output can meet it",
                pointer=pointer,
                keyword="max_repeat",
            )

    def _pattern(self, pattern: str, pointer: str, key: str) -> None:
        if len(pattern.encode()) > self.limits.max_pattern_bytes:
            raise LimitExceeded(
                f"the pattern is {len(pattern.encode())} bytes; the limit is {self.limits.max_pattern_bytes}",
                pointer=pointer,
                keyword="max_pattern_bytes",
            )
        try:
            compile_pattern(pattern)
        except PatternError as exc:
            raise SchemaError(f"invalid regular expression {pattern!r}: {exc}", pointer=pointer, keyword=key) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
