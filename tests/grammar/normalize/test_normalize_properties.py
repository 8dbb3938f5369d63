"""Tests of ``tokenmold.grammar.jsonschema``: strict mode, purity, the report, and corpus-wide properties.

Grammar tests compile the normalized schema with xgrammar (``normalize_helpers``) and check that
instances valid under the *original* schema are accepted and that the invalid ones the rule is
meant to exclude are rejected.
"""

from __future__ import annotations

import copy
import glob
import itertools
import json
import os
from typing import Any

import pytest
import xgrammar as xgr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from normalize_helpers import MASKBENCH, accepts, check_grammar
from support.strategies import VALUES, schema_strategy, semantic_schemas

from tokenmold.grammar.errors import ShapeError
from tokenmold.grammar.jsonschema import normalize, normalize_schema
from tokenmold.grammar.jsonschema.fold import fold_llguidance_only

# -- strict mode, purity, report ---------------------------------------------------------------------------


def test_strict_closes_objects_and_requires_all_properties(compiler: xgr.GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "o": {"type": "object", "properties": {"b": {"type": "string"}}}},
    }
    out = normalize_schema(schema, strict=True).schema
    assert out["required"] == ["a", "o"] and out["additionalProperties"] is False
    assert out["properties"]["o"]["required"] == ["b"] and out["properties"]["o"]["additionalProperties"] is False
    check_grammar(
        compiler,
        schema,
        valid=[{"a": 1, "o": {"b": "x"}}],
        invalid=[{"a": 1}, {"a": 1, "o": {"b": "x"}, "z": 1}],
        strict=True,
    )


def test_normalize_is_pure_and_deterministic() -> None:
    schema = {
        "$defs": {"x": {"type": "object", "properties": {"k": {"$ref": "#/$defs/x"}}}},
        "type": "object",
        "allOf": [{"properties": {"a": {"$ref": "#/$defs/x"}}}, {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}],
        "patternProperties": {"^z": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    }
    original = copy.deepcopy(schema)
    first, second = normalize_schema(schema), normalize_schema(schema)
    assert schema == original
    assert json.dumps(first.schema) == json.dumps(second.schema)
    assert first.report.as_dict() == second.report.as_dict()


def test_true_schema_accepts_anything() -> None:
    assert normalize_schema(True).schema == {}
    assert normalize_schema({}).schema == {}


def test_report_names_enforced_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "minLength": 1},
            "e": {"type": "string", "format": "email"},
            "p": {"type": "string", "pattern": "^a"},
            "n": {"type": "integer", "maximum": 3},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    report = normalize_schema(schema).report
    assert report.enforced == {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "minLength",
        "pattern",
        "format",
        "maximum",
    }
    assert report.validated_only == []


# -- corpus and properties ------------------------------------------------------------------------------------


def _corpus_sample() -> list[str]:
    files = sorted(glob.glob(os.path.join(MASKBENCH, "*.json")))
    return files[:: max(1, len(files) // 300)]


@pytest.mark.skipif(not os.path.isdir(MASKBENCH), reason="MaskBench corpus not present")
@pytest.mark.filterwarnings("ignore::FutureWarning")  # Python's re on patterns like "[[" in the corpus
def test_maskbench_sample_normalizes_or_raises_shape_errors() -> None:
    failures = []
    for path in _corpus_sample():
        with open(path, encoding="utf-8") as handle:
            schema = json.load(handle)["schema"]
        try:
            normalize_schema(schema)
        except ShapeError:
            continue
        except Exception as exc:  # the point: anything but a ShapeError is a bug
            failures.append(f"{os.path.basename(path)}: {type(exc).__name__}: {exc}")
    assert not failures, failures


_JSONVALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=6,
)
_KEYWORDVALUES = {
    "type": st.sampled_from(
        ["string", "integer", "number", "object", "array", "boolean", "null", ["string", "null"], "bogus"]
    ),
    "minimum": st.integers(-3, 3),
    "maximum": st.integers(-3, 3),
    "exclusiveMinimum": st.floats(-3, 3),
    "minLength": st.integers(0, 3),
    "maxLength": st.integers(0, 3),
    "minItems": st.integers(0, 3),
    "maxItems": st.integers(0, 3),
    "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    "enum": st.lists(_JSONVALUES, max_size=3),
    "const": _JSONVALUES,
    "pattern": st.sampled_from(["^a", "b", "(?=x)", "a|b$"]),
    "format": st.sampled_from(["date", "email", "int32"]),
    "multipleOf": st.sampled_from([1, 2, 0.5]),
    "$ref": st.sampled_from(["#", "#/$defs/d", "#/$defs/missing", "#/properties/a", "http://x/y"]),
    "uniqueItems": st.booleans(),
}


def _schemas() -> st.SearchStrategy[Any]:
    """Messy schemas (bogus types, dangling and remote refs): normalized or refused, never a crash."""
    return schema_strategy(
        _KEYWORDVALUES,
        st.sampled_from(["a", "b", "c"]),
        ["^x", "y"],
        {"$defs": lambda inner: st.fixed_dictionaries({"d": inner})},
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas())
def test_random_schemas_normalize_or_raise_shape_errors_and_compile(compiler: xgr.GrammarCompiler, schema: Any) -> None:
    try:
        out = normalize_schema(schema)
    except ShapeError:
        return
    text = json.dumps(fold_llguidance_only(out.schema))  # plain JSON, folded as the xgrammar backend does
    compiler.compile_json_schema(text, any_whitespace=False, strict_mode=False, separators=(",", ":"))


#: The normalizer's shortcuts, each replaced by one that never applies (the whole merge then runs).
_WITHOUT = {"plain_leaf": lambda schema, known: None, "plain_object": lambda schema, known: False}


def _normalized_both_ways(schema: Any, strict: bool, shortcut: str = "plain_leaf") -> tuple[Any, Any]:
    """The normalization of ``schema`` with ``shortcut`` (``merge.plain_leaf``: primitive leaves
    taken as they are; ``merge.plain_object``: plain objects written directly) and through the
    whole merge: schema (as text, key order included), report, or the error, each way."""

    def outcome() -> Any:
        try:
            out = normalize_schema(schema, strict=strict)
        except ShapeError as exc:
            return type(exc).__name__, exc.as_fields()
        report = out.report
        notes = (report.validated_only, report.narrowed, sorted(map(repr, report.llguidance_only)))
        return json.dumps(out.schema), sorted(report.enforced), notes

    fast = outcome()
    kept = getattr(normalize, shortcut)
    setattr(normalize, shortcut, _WITHOUT[shortcut])
    try:
        return fast, outcome()
    finally:
        setattr(normalize, shortcut, kept)


@pytest.mark.skipif(not os.path.isdir(MASKBENCH), reason="MaskBench corpus not present")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("shortcut", sorted(_WITHOUT))
def test_shortcuts_normalize_as_the_whole_merge_would_on_maskbench(shortcut: str) -> None:
    """Each shortcut writes what the merge writes (checked on all 8,481 files once; a sample
    here), strict or not."""
    for path in _corpus_sample():
        with open(path, encoding="utf-8") as handle:
            schema = json.load(handle)["schema"]
        for strict in (False, True):
            fast, merged = _normalized_both_ways(schema, strict, shortcut)
            assert fast == merged, (os.path.basename(path), strict)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schema=_schemas(),
    leaf=st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
        optional={
            "title": st.text(max_size=3),
            "description": st.text(max_size=3),
            "default": VALUES,
            "examples": st.lists(VALUES, max_size=2),
            "x-extra": VALUES,
            "const": VALUES,
            "id": st.just("#x"),
            "$id": st.just("#x"),
            "$comment": st.text(max_size=3),
            "definitions": st.just({"d": {"type": "integer"}}),
            "$defs": st.just({"d": {"type": "integer"}}),
        },
    ),
    draft=st.sampled_from([None, "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"]),
)
def test_primitive_leaves_normalize_as_the_whole_merge_would(schema: Any, leaf: Any, draft: str | None) -> None:
    """Random schemas with a random leaf among their properties (annotations, words the draft does
    not know, draft-04's ``const``, ids, definitions), under three drafts."""
    root: Any = {"type": "object", "properties": {"leaf": leaf, "other": schema}}
    if draft is not None:
        root["$schema"] = draft
    for strict in (False, True):
        fast, merged = _normalized_both_ways(root, strict)
        assert fast == merged


_NAMES = st.sampled_from(["a", "b", "c/d", "~e"])
#: Members that normalize (or are impossible: a contradiction) more often than ``_schemas``' do.
_MEMBERS = [
    {"type": "string"},
    {},
    {"type": "object"},
    {"enum": [1, "x"]},
    {"type": "integer", "minimum": 3, "maximum": 1},
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.dictionaries(_NAMES, st.one_of(st.booleans(), st.sampled_from(_MEMBERS), _schemas()), max_size=4),
    required=st.lists(_NAMES, max_size=4),
    rest=st.fixed_dictionaries(
        {},
        optional={
            "additionalProperties": st.sampled_from([True, False, {}, {"type": "integer"}]),
            "title": st.text(max_size=3),
            "description": st.text(max_size=3),
            "default": VALUES,
            "x-extra": VALUES,
            "$comment": st.text(max_size=3),
            "minProperties": st.integers(0, 2),
            "const": VALUES,
        },
    ),
    listed=st.booleans(),
    draft=st.sampled_from([None, "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#"]),
)
@example(members={"a": {}}, required=["a", "a"], rest={}, listed=True, draft=None)
@example(members={"a": False, "b": {}}, required=["b"], rest={"additionalProperties": False}, listed=True, draft=None)
def test_plain_objects_normalize_as_the_whole_merge_would(
    members: Any, required: Any, rest: Any, listed: bool, draft: str | None
) -> None:
    """Random objects around the shortcut's edge: impossible members (``false``, contradictions),
    required or not, in closed and open objects, required names listed or not, repeated, escaped
    in pointers, next to annotations, words the draft does not know and keywords that send the
    object through the merge; at the root, as a property and as array items."""
    plain: Any = {"type": "object", **({"properties": members} if listed else {}), **rest}
    if required:
        plain["required"] = required
    root: Any = {"type": "object", "properties": {"o": plain, "list": {"type": "array", "items": plain}}}
    for schema in (plain, root):
        if draft is not None:
            schema = {**schema, "$schema": draft}
        for strict in (False, True):
            fast, merged = _normalized_both_ways(schema, strict, "plain_object")
            assert fast == merged


# Semantic properties, checked through the compiled grammar (whitespace allowed, so that xgrammar's
# compact-separator slip on unconstrained values does not interfere): a valid instance is always
# accepted (object keys may have to follow the declared order: xgrammar fixes property order), and
# without validated_only notes an accepted instance is valid.


def _key_orders(value: Any, budget: int = 24) -> list[Any]:
    """``value`` with its object keys permuted (at most ``budget`` variants). A level's orders and
    its members' variants advance together, in square shells over the two, so neither starves the
    other: xgrammar writes declared properties first, and ``{"a","b","x1":{3 keys}}`` under
    ``required: ["x1"]`` was rejected when the first four outer orders, each with its 3! inner
    ones, took the whole budget before any order put ``x1`` first."""
    if isinstance(value, dict):
        keys = list(value)
        orders = list(itertools.islice(itertools.permutations(range(len(keys))), budget))
        members = list(itertools.islice(itertools.product(*(_key_orders(value[key], budget) for key in keys)), budget))
        pairs = sorted(itertools.product(range(len(orders)), range(len(members))), key=max)[:budget]
        return [{keys[at]: members[j][at] for at in orders[i]} for i, j in pairs]
    if isinstance(value, list):
        return [
            list(members)
            for members in itertools.islice(itertools.product(*(_key_orders(v, budget) for v in value)), budget)
        ]
    return [value]


def _compile_spaced(compiler: xgr.GrammarCompiler, normalized: Any) -> xgr.CompiledGrammar:
    """Folded as the xgrammar backend does (no key patterns, one string constraint)."""
    text = json.dumps(fold_llguidance_only(normalized))
    return compiler.compile_json_schema(text, any_whitespace=True, strict_mode=False)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schema=semantic_schemas(), instances=st.lists(VALUES, min_size=1, max_size=8))
@example(schema={"required": ["x1"]}, instances=[{"a": None, "b": None, "x1": {"a": None, "b": None, "c": None}}])
def test_valid_instances_are_accepted(compiler: xgr.GrammarCompiler, schema: Any, instances: list[Any]) -> None:
    try:
        normalized = normalize_schema(schema).schema
    except ShapeError:
        return
    validator = Draft202012Validator(schema)
    valid = [instance for instance in instances if validator.is_valid(instance)]
    if valid:
        compiled = _compile_spaced(compiler, normalized)
        for instance in valid:
            assert any(accepts(compiled, variant) for variant in _key_orders(instance)), (schema, normalized, instance)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(schema=semantic_schemas(), instances=st.lists(VALUES, min_size=1, max_size=8))
@example(schema={"maxLength": 0, "pattern": "^a"}, instances=["a"])  # drawn by earlier runs: see the skip
@example(schema={"patternProperties": {"^x": False}}, instances=[{"a": None, "x1": None}])
def test_accepted_instances_are_valid_unless_reported(
    compiler: xgr.GrammarCompiler, schema: Any, instances: list[Any]
) -> None:
    try:
        out = normalize_schema(schema)
    except ShapeError:
        return
    # As xgrammar enforces it: the string constraints only llguidance intersects are folded away
    # (``{"maxLength": 0, "pattern": "^a"}`` keeps the pattern) and reported for that engine.
    if out.report.for_engine("xgrammar").validated_only:
        return
    validator = Draft202012Validator(schema)
    compiled = _compile_spaced(compiler, out.schema)
    for instance in instances:
        if accepts(compiled, instance):
            assert validator.is_valid(instance), (schema, out.schema, instance)
