"""Put a JSON instance's object keys in the order its schema lists them.

Every engine benchmarked emits an object's properties in the order of ``properties`` (tokenmold by
design, see docs/design.md), while MaskBench's instances often list them in another order. The
masks benchmark re-walks a rejected valid instance in schema order: when that is accepted, the
rejection is counted as property order (a layout choice), not as a value the grammar cannot
produce. Reordering never changes the instance's value, so the classification is sound however
the order is guessed; a wrong guess only leaves a rejection counted as "other".
"""

from __future__ import annotations

import re
from typing import Any

from jsonschema.validators import validator_for

from tokenmold.grammar.json_pointer import read_token

_BRANCHES = ("anyOf", "oneOf")


class _SchemaOrder:
    def __init__(self, root: dict[str, Any] | bool) -> None:
        self.root = root
        self._validator = validator_for(root)(root) if isinstance(root, dict) else None

    def resolve(self, schema: Any) -> dict[str, Any]:
        """Follow local ``$ref`` chains (a ref's siblings are kept); anything else is opaque ({})."""
        seen: set[str] = set()
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            ref = schema["$ref"]
            if not ref.startswith("#") or ref in seen:
                return {}
            seen.add(ref)
            target: Any = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = read_token(part)
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    return {}
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {"allOf": [target, siblings]} if siblings else target
        return schema if isinstance(schema, dict) else {}

    def matching_branch(self, branches: list[Any], data: Any) -> Any:
        """The first branch the instance is valid against (the one whose layout it was meant to follow)."""
        if self._validator is not None:
            for branch in branches:
                try:
                    if self._validator.evolve(schema=branch).is_valid(data):
                        return branch
                except Exception:  # an exotic branch the validator cannot handle: try the next
                    continue
        return None

    def parts(self, schema: Any, data: Any) -> list[dict[str, Any]]:
        """The schema objects that apply to ``data``, in the order their properties are laid out."""
        schema = self.resolve(schema)
        found = [schema]
        for branch in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            found += self.parts(branch, data)
        for keyword in _BRANCHES:
            if isinstance(schema.get(keyword), list):
                chosen = self.matching_branch(schema[keyword], data)
                if chosen is not None:
                    found += self.parts(chosen, data)
        return found

    def order(self, data: Any, schema: Any, *, close: bool = False) -> Any:
        parts = self.parts(schema, data)
        if isinstance(data, dict):
            if close and _silent_about_extras(parts):
                listed = {name for part in parts for name in _listed(part)}
                data = {key: value for key, value in data.items() if key in listed}
            rank: dict[str, int] = {}
            for part in parts:
                for name in part.get("properties", {}) if isinstance(part.get("properties"), dict) else {}:
                    rank.setdefault(name, len(rank))
            for part in parts:  # required but not listed: the grammar declares them after the listed
                for name in part.get("required", []) if isinstance(part.get("required"), list) else []:
                    if isinstance(name, str):
                        rank.setdefault(name, len(rank))
            keys = sorted(data, key=lambda k: rank.get(k, len(rank)))
            return {key: self.order(data[key], self._child(parts, key), close=close) for key in keys}
        if isinstance(data, list):
            return [self.order(item, self._item(parts, i), close=close) for i, item in enumerate(data)]
        return data

    @staticmethod
    def _child(parts: list[dict[str, Any]], key: str) -> Any:
        for part in parts:
            properties = part.get("properties")
            if isinstance(properties, dict) and key in properties:
                return properties[key]
        for part in parts:
            patterns = part.get("patternProperties")
            for pattern, subschema in patterns.items() if isinstance(patterns, dict) else ():
                try:
                    if re.search(pattern, key):
                        return subschema
                except re.error:  # an ECMA-only construct: not this one
                    continue
        for part in parts:
            if isinstance(part.get("additionalProperties"), dict):
                return part["additionalProperties"]
        return {}

    @staticmethod
    def _item(parts: list[dict[str, Any]], index: int) -> Any:
        for part in parts:
            prefix = part.get("prefixItems", part.get("items") if isinstance(part.get("items"), list) else None)
            if isinstance(prefix, list) and index < len(prefix):
                return prefix[index]
        for part in parts:
            items = part.get("items") if isinstance(part.get("items"), dict) else part.get("additionalItems")
            if isinstance(items, dict):
                return items
        return {}


def _listed(part: dict[str, Any]) -> list[str]:
    """The names a schema object lists: its ``properties`` and its ``required``."""
    properties = part.get("properties")
    required = part.get("required")
    names = list(properties) if isinstance(properties, dict) else []
    return names + [n for n in required if isinstance(n, str)] if isinstance(required, list) else names


def _silent_about_extras(parts: list[dict[str, Any]]) -> bool:
    """Whether tokenmold's layout closes this object (``grammar/object_keys.py``): it lists names and no
    part says anything about other keys."""
    return any(_listed(part) for part in parts) and not any(
        "additionalProperties" in part or "patternProperties" in part for part in parts
    )


def in_closed_layout(data: Any, schema: dict[str, Any] | bool) -> Any:
    """``data`` in schema order with the keys left out that a closed-by-default layout never writes:
    those an object does not list where its schema says nothing about other keys. Unlike reordering
    this changes the value, so a mask that accepts the result only shows that the layout's
    narrowing (recorded as ``keywords.narrowed`` in every report) explains the rejection."""
    return _SchemaOrder(schema).order(data, schema, close=True)


def in_schema_order(data: Any, schema: dict[str, Any] | bool) -> Any:
    """``data`` with every object's keys in the order the schema (its matching branches included)
    lists them in ``properties``, then required keys it does not list there (the normalizer
    declares those after the listed ones); other keys keep their relative order, last."""
    return _SchemaOrder(schema).order(data, schema)
