"""Whether budget fitting can plan every value of a shape exactly, decided before decoding.

The fitter's promise (an answer that closes within ``max_tokens``) holds only where the tracker
knows the shortest completion at every position. Where it cannot (a string pattern with no
automaton under the caps, or written with anchors the planner does not read; an ``allOf`` the
normalizer left; a ``minProperties`` above the required members, which the shortest completion
does not count; a ``multipleOf``), the mask would price positions wrongly and the answer could end truncated. Such
a shape is refused up front instead (``FitUnplannable``, a 400 ``fit_unplannable`` naming the
place), never accepted and then truncated.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenmold.grammar.budget.patterns import Unplannable, string_rule
from tokenmold.grammar.budget.schema import CALLS_KEY
from tokenmold.grammar.json_pointer import pointer_token

#: Keywords whose value is a list of subschemas, or a map of them.
_LISTS = ("anyOf", "oneOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SINGLE = ("items", "additionalProperties")


class Gap(NamedTuple):
    """Where fitting cannot plan, and why."""

    pointer: str
    reason: str


def first_gap(root: Any) -> Gap | None:
    """The first place in a fit target (a normalized schema, or tool calls' ``CallLayout`` JSON)
    whose shortest completions cannot be planned, or ``None``."""
    if isinstance(root, dict) and CALLS_KEY in root:
        for index, tool in enumerate(root.get("tools", [])):
            found = _gap(tool, f"/tools/{index}")
            if found is not None:
                return found
        return None
    return _gap(root, "")


def _gap(schema: Any, pointer: str) -> Gap | None:
    if not isinstance(schema, dict):
        return None
    if "allOf" in schema:
        return Gap(pointer, "an allOf the normalizer could not merge")
    low = schema.get("minProperties", 0)
    if isinstance(low, int) and low > len(schema.get("required", [])):
        return Gap(pointer, f"minProperties {low} above the required members (the planner adds no optional ones)")
    if schema.get("multipleOf", 1) != 1:
        return Gap(pointer, "a multipleOf, whose shortest multiples the planner does not write")
    types = schema.get("type")
    stringy = types is None or types == "string" or (isinstance(types, list) and "string" in types)
    if stringy and "enum" not in schema and "const" not in schema:
        try:
            rule = string_rule(schema)
        except Unplannable as exc:
            return Gap(pointer, str(exc))
        if rule is not None and rule.shortest is None:
            return Gap(pointer, "no string meets its pattern, format and lengths")
    for keyword in _SINGLE:
        found = _gap(schema.get(keyword), f"{pointer}/{keyword}")
        if found is not None:
            return found
    for keyword in _LISTS:
        for index, sub in enumerate(schema.get(keyword) or []):
            found = _gap(sub, f"{pointer}/{keyword}/{index}")
            if found is not None:
                return found
    for keyword in _MAPS:
        subs = schema.get(keyword)
        for name, sub in subs.items() if isinstance(subs, dict) else ():
            found = _gap(sub, f"{pointer}/{keyword}/{pointer_token(name)}")
            if found is not None:
                return found
    return None
