"""The formats the pattern guard holds (``tokenmold.grammar.guards.string_format``): a ``hostname``,
``email`` or ``uri`` string compiles without its ``format`` and the guard runs llguidance's own
expression for it. Checked string by string against llguidance with the format in its grammar and
against the expression itself, on random walks against llguidance, and on the engine's path."""

from __future__ import annotations

import json

import pytest
import regex
from support.guard_paths import engine_and_local, first_refused
from test_anchored_pattern import _llguidance, _normalized, check_walks_against_llguidance

from benchmarks.bitmasks import mask_accepts
from tokenmold.grammar.backends.base import CompiledGrammar, JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.guards.anchored_pattern import automaton
from tokenmold.grammar.guards.held_keywords import FORMAT_BOUND, strip_bounds
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS

SAMPLES = {
    "hostname": [
        "example.com",
        "a",
        "a-b.c",
        "www.googleapis.com",
        "x" * 63,
        "x" * 64,
        "-ab.com",
        "ab-.com",
        "a..b",
        "a_b.com",
        "ex.com.",
        "1.2.3.4",
        "",
        "ex ample.com",
        "é.com",
    ],
    "email": [
        "a@b.io",
        "john.doe@example.com",
        "a+b@c-d.e",
        "a@[192.168.0.1]",
        "a.@b.io",
        ".a@b",
        "a@[300.1.1.1]",
        "a@b-",
        "a b@c",
        "a@b..c",
        "@b",
        "a@",
        "a@b@c",
        "é@b.io",
    ],
    "uri": [
        "https://example.com",
        "https://www.example.com/path/to/page?x=1#f",
        "mailto:a@b.io",
        "urn:isbn:0451450523",
        "http://[::1]:80/",
        "http://[2001:db8::7]/c=GB?objectClass?one",
        "http://192.168.0.1/",
        "ftp://user:pw@host/x%20y",
        "a:",
        "example.com",
        "http://a b",
        "1http://x",
        "http://x/%zz",
        "http://[::1",
        "http://é.com",
        "",
        "https://x.io/a\\b",
        'https://x.io/"q"',
        "http://[v1.x]/",
    ],
}
CASES = [(name, text) for name, texts in SAMPLES.items() for text in texts]


@pytest.fixture(scope="module")
def grammars(vocab) -> dict[str, tuple[CompiledGrammar, CompiledGrammar]]:
    """Per format, the guarded grammar of ``{"v": <format>}`` and llguidance's with the format in it."""
    out = {}
    for name in FORMAT_PATTERNS:
        schema = _normalized({"type": "object", "properties": {"v": {"type": "string", "format": name}}})
        guarded = LLGuidanceBackend(vocab).compile_json_schema(schema, JsonOptions())
        assert guarded.bounds is not None and name not in guarded.grammar
        out[name] = (guarded, _llguidance(vocab, schema))
    return out


@pytest.mark.parametrize(("name", "text"), CASES, ids=[f"{n}:{t[:24]}" for n, t in CASES])
def test_the_mask_admits_what_llguidance_admitted_and_the_expression_matches(vocab, grammars, name, text) -> None:
    """The expression is llguidance's own: it matches a string exactly where llguidance with the
    format in its grammar lets it through, and so does the guarded mask."""
    guarded, reference = grammars[name]
    document = json.dumps({"v": text}, separators=(",", ":"))
    expected = mask_accepts(vocab, reference, document)
    assert (regex.fullmatch(FORMAT_PATTERNS[name][1:-1], text) is not None) == expected
    assert mask_accepts(vocab, guarded, document) == expected


def test_formats_leave_the_grammar_where_the_guard_holds_them() -> None:
    """Held: the three formats, alone or with a ``maxLength`` of at least ``FORMAT_BOUND`` (pydantic's
    ``HttpUrl``), which the length guard then holds too. Kept in the grammar: other formats, a
    format next to another shape or a shorter bound."""
    assert all(automaton(p) is not None for p in FORMAT_PATTERNS.values())
    http_url = {"type": "string", "format": "uri", "maxLength": 2083, "minLength": 1}
    stripped = strip_bounds(
        {"type": "object", "properties": {"u": http_url, "h": {"type": "string", "format": "hostname"}}}
    )
    assert stripped.anchored == 2 and stripped.lengths == 1
    assert stripped.schema["properties"]["u"] == {"type": "string", "minLength": 1}
    for kept in (
        {"type": "string", "format": "uuid"},
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "email", "maxLength": FORMAT_BOUND - 1},
        {"type": "string", "format": "email", "pattern": "^a.*$"},
        {"type": "string", "format": "uri", "enum": ["https://x.io"]},
    ):
        assert strip_bounds(kept).anchored == 0, kept


@pytest.mark.parametrize(("name", "likely"), [("hostname", b"abcxyz0123-."), ("email", b"abxy.@"), ("uri", b"abxy:/.")])
def test_guarded_formats_walk_as_llguidance_walks(vocab, name, likely) -> None:
    """Random walks through the real vocabulary, biased to the formats' characters: the guard allows
    what llguidance allows with the format in its grammar, and the completed walks are valid."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}}, "required": ["v"]}
    check_walks_against_llguidance(vocab, schema, likely)


def test_the_engine_holds_a_format_as_the_in_process_matcher_does(vocab) -> None:
    """The plugin's path: the same rows as the in-process matcher, and an underscore (no hostname
    takes one) cannot be written."""
    schema = _normalized({"type": "object", "properties": {"host": {"type": "string", "format": "hostname"}}})
    engine, local = engine_and_local(vocab, schema)
    refused = first_refused(vocab, engine, local, '{"host":"my_host.example.com"}')
    assert refused is not None and "_" in refused
