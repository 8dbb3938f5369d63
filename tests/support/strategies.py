"""Hypothesis strategies shared by the property tests: small JSON Schemas that mix every keyword
family the normalizer handles, and small JSON values over the same few keys (so that values and
schemas meet: a generated instance often matches a generated ``properties``)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck
from hypothesis import strategies as st

KEYS = st.sampled_from(["a", "b", "c", "x1"])
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.5, -0.5, "", "a", "ab", "b"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
SEMANTIC_KEYWORDS = {
    "type": st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null", ["string", "null"]]),
    "minimum": st.integers(-2, 2),
    "maximum": st.integers(-2, 2),
    "exclusiveMinimum": st.sampled_from([-1.5, 0, 1]),
    "minLength": st.integers(0, 2),
    "maxLength": st.integers(0, 2),
    "minItems": st.integers(0, 2),
    "maxItems": st.integers(0, 2),
    "minProperties": st.integers(0, 2),
    "maxProperties": st.integers(0, 2),
    "required": st.lists(KEYS, max_size=2, unique=True),
    "enum": st.lists(VALUES, min_size=1, max_size=3),
    "const": VALUES,
    "pattern": st.sampled_from(["^a", "b", "a|b$"]),
    "multipleOf": st.sampled_from([1, 2, 0.5]),
    "uniqueItems": st.booleans(),
}


def schema_strategy(
    keywords: dict[str, st.SearchStrategy[Any]],
    names: st.SearchStrategy[str],
    patterns: list[str],
    extra: dict[str, Any],
) -> st.SearchStrategy[Any]:
    """Schemas nesting up to 8 leaves: ``keywords`` at every level, subschemas under every
    applicator, property names from ``names``, pattern-property keys from ``patterns``, and
    ``extra`` optional keywords (given the inner strategy) on composite levels."""
    leaf = st.booleans() | st.fixed_dictionaries({}, optional=keywords)
    return st.recursive(
        leaf,
        lambda inner: st.fixed_dictionaries(
            {},
            optional={
                **keywords,
                "properties": st.dictionaries(names, inner, max_size=3),
                "additionalProperties": inner,
                "patternProperties": st.dictionaries(st.sampled_from(patterns), inner, max_size=2),
                "items": inner,
                "prefixItems": st.lists(inner, min_size=1, max_size=2),
                "allOf": st.lists(inner, min_size=1, max_size=3),
                "anyOf": st.lists(inner, min_size=1, max_size=3),
                "oneOf": st.lists(inner, min_size=1, max_size=2),
                "not": inner,
                **{key: make(inner) for key, make in extra.items()},
            },
        ),
        max_leaves=8,
    )


def semantic_schemas() -> st.SearchStrategy[Any]:
    """Schemas whose keywords all have a meaning the normalizer must keep (the property tests)."""
    return schema_strategy(
        SEMANTIC_KEYWORDS,
        KEYS,
        ["^x", "b", ".*"],
        {"$ref": lambda inner: st.sampled_from(["#/properties/a", "#/allOf/0", "#"])},
    )


def exploration_settings(examples: int) -> dict[str, Any]:
    """Hypothesis settings for the suite's exploratory property tests: ``examples`` fixed examples
    (derandomized, so that CI is reproducible), or with ``TOKENMOLD_PROPERTY_EXAMPLES=N`` set, N
    fresh random ones (a longer hunt, run by hand)."""
    override = os.environ.get("TOKENMOLD_PROPERTY_EXAMPLES")
    return {
        "max_examples": int(override) if override else examples,
        "derandomize": not override,
        "deadline": None,
        "database": None,
        "suppress_health_check": list(HealthCheck),
    }
