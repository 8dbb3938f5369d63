"""Unanchored patterns (``tokenmold.grammar.guards.unanchored_pattern``): strings whose pattern may match
anywhere compile without it and the bound guard checks their closing quotes. Checked against
llguidance with the pattern in its grammar on random walks through the real vocabulary (the guard
keeps every token llguidance allows, and every finished walk is valid for the schema as written),
and on the engine's path (``vllm_plugin``)."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import numpy as np
import pytest
import torch
from support.guard_paths import engine_and_local, first_refused

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import allowed_tokens
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.grammar.guards.item_count import closing_quote
from tokenmold.grammar.guards.unanchored_pattern import _searcher, restrict_closing, searching
from tokenmold.grammar.jsonschema.normalize import normalize_schema

#: A match that lasts once found, and one that must end the text (``$``).
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "[0-9]{2}"}}, "required": ["code"]}
ENDING = {"type": "array", "items": {"type": "string", "pattern": "a[bc]$"}, "minItems": 1}
LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def _normalized(schema):
    return normalize_schema(schema).schema


def test_only_patterns_that_may_match_anywhere_leave_the_grammar() -> None:
    assert searching(_normalized(CODE)["properties"]["code"]["pattern"])  # ^.*[0-9]{2}.*$
    assert not searching("^[0-9]{2}$") and not searching("^.*[^a]b.*$")  # anchored; a negated class
    assert not searching("^.*(.*$")  # not a regular expression
    stripped = strip_bounds(_normalized(CODE))
    assert stripped.patterns == 1 and "pattern" not in stripped.schema["properties"]["code"]
    bounded = {"type": "string", "pattern": "^.*x.*$", "maxLength": 3}
    assert strip_bounds(bounded).patterns == 0  # llguidance proves an impossible pair at compile time
    assert strip_bounds({"type": "string", "pattern": "^.*x.*$", "format": "email"}).patterns == 0


@pytest.mark.parametrize("core", ["[0-9]{2}", "ab+c", "\\d{4}-\\d{2}", "[a-f]x?", "a.b"])
def test_a_closer_is_searched_unless_it_cannot_complete_a_match(vocab, core) -> None:
    """The closers a pattern skips write no character a match can end with: after a content with
    no match, none of them ever completes one (random contents over the patterns' characters)."""
    pattern = f"^.*{core}.*$"
    searcher = _searcher(pattern)
    closers = vocab.bound_table.closers
    skipped = [t for t, kept in zip(closers.texts, closers.completing(pattern, searcher), strict=True) if not kept]
    assert skipped and all(t for t in skipped)  # the bare quote is always searched
    rng = random.Random(core)
    checked = 0
    for _ in range(400):
        content = "".join(rng.choice("abcdefx.-0123456789") for _ in range(rng.randrange(8)))
        if searcher.regex.search(content) is None:
            checked += 1
            assert not [t for t in skipped if searcher.regex.search(content + t)], content
    assert checked > 50


@pytest.mark.parametrize("pattern", ["^.*[0-9]{2}.*$", "^.*ab+c.*$", "^.*a[bc]$"])
def test_a_scan_carried_along_a_string_clears_what_a_fresh_search_clears(vocab, pattern) -> None:
    """Each step reads only what the content adds to the previous step's scan (split escapes and
    split UTF-8 characters included): the rows and the verdict "found" match a search from scratch."""
    closers = vocab.bound_table.closers
    pieces = [b"a", b"b", b"c", b"1", b"2", b"x", b"\\", b"n", b"\\u00e9", "\u00e9".encode()[:1], "\u00e9".encode()[1:]]
    rng = random.Random(pattern)
    for _ in range(30):
        raw, before = b"", None
        for _ in range(12):
            raw += rng.choice(pieces)
            fresh = np.full((vocab.vocab_size + 31) // 32, -1, dtype=np.int32)
            carried = fresh.copy()
            alone = restrict_closing(raw, [pattern], closers, fresh)
            scan = restrict_closing(raw, [pattern], closers, carried, before)
            assert np.array_equal(fresh, carried), raw
            assert (alone is None) == (scan is None), raw
            if scan is None:
                break
            before = scan
        # The next string at the same place starts afresh, whatever the last one's scan held.
        fresh = np.full((vocab.vocab_size + 31) // 32, -1, dtype=np.int32)
        carried = fresh.copy()
        restrict_closing(b"12", [pattern], closers, fresh)
        restrict_closing(b"12", [pattern], closers, carried, before)
        assert np.array_equal(fresh, carried), (raw, before)


def test_after_an_open_escape_every_token_that_closes_the_string_is_searched(vocab) -> None:
    """Where the content so far ends in an open escape or a split character, the closers' plain
    reading does not hold: after a backslash ``"]["`` escapes its first quote and closes the string
    with its last. Such a token is kept only where the content it closes holds a match (found by a
    random walk on MaskBench's ``o42982``: a string with no ``mesh_settings`` in it was closed)."""
    pattern = "^.*[0-9]{2}.*$"
    search = _searcher(pattern).regex.search
    closers, spelling = vocab.bound_table.closers, vocab.bound_table.by_id
    both = next(t for t, data in enumerate(spelling) if data == b'"]["')
    for raw, kept in ((b"ab\\", False), (b"12\\", True), (b"a\\u00", None), ("\u00e9".encode()[:1], None)):
        row = np.full((vocab.vocab_size + 31) // 32, -1, dtype=np.int32)
        restrict_closing(raw, [pattern], closers, row)
        allowed = set(allowed_tokens(row, vocab.vocab_size).tolist())
        if kept is not None:
            assert (both in allowed) is kept, raw
        for token in allowed:
            text = raw + spelling[token]
            at = closing_quote(text)
            if at is None:
                continue
            try:
                content = json.loads(b'"' + text[:at] + b'"')
            except ValueError:
                continue  # not a JSON string: llguidance refuses it
            assert search(content) is not None, (raw, spelling[token])


def _llguidance(vocab, schema):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": LAYOUT}))
    return LLGuidanceBackend(vocab).compile_grammar(grammar)


@pytest.mark.parametrize(
    ("schema", "preferred"),
    [(CODE, [str(d).encode() for d in range(10)]), (ENDING, [b"ab", b"ac", b"a"])],
    ids=["lasting", "ending"],
)
def test_the_guarded_mask_keeps_llguidances_mask_and_every_walk_ends_valid(vocab, schema, preferred) -> None:
    """Every token llguidance allows with the pattern in its grammar, the guard allows; the guard
    refuses only closing quotes; walks that prefer short tokens and quotes all end valid."""
    normalized = _normalized(schema)
    guarded = LLGuidanceBackend(vocab).compile_json_schema(normalized, JsonOptions())
    assert guarded.bounds is not None
    reference, bare = _llguidance(vocab, normalized), _llguidance(vocab, strip_bounds(normalized).schema)
    spelling = vocab.bound_table.by_id
    # What each draw looks for, per token, worked out once rather than at every step.
    quoting = [b'"' in text for text in spelling]
    shorts = [0 < len(text) <= 2 and b"\\" not in text for text in spelling]
    stops = set(vocab.stop_token_ids)
    rng = random.Random(5)
    rows = torch.zeros((3, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    completed = held = 0
    for _ in range(10):
        ours_m, theirs_m, bare_m = guarded.matcher(), reference.matcher(), bare.matcher()
        tokens: list[int] = []
        for _ in range(80):
            ours_m.fill_next_token_bitmask(rows, 0)
            bare_m.fill_next_token_bitmask(rows, 2)
            ours, unguarded = (set(allowed_tokens(rows[i].numpy(), vocab.vocab_size).tolist()) for i in (0, 2))
            if theirs_m is not None:
                theirs_m.fill_next_token_bitmask(rows, 1)
                assert set(allowed_tokens(rows[1].numpy(), vocab.vocab_size).tolist()) <= ours
            assert all(b'"' in spelling[t] for t in unguarded - ours)
            held += bool(unguarded - ours)
            quotes = [t for t in ours if quoting[t] or t in stops]
            digits = [t for t in ours if spelling[t] in preferred]
            short = [t for t in ours if shorts[t]] or sorted(ours)
            draw = rng.random()
            token = rng.choice(quotes if quotes and draw < 0.35 else digits if digits and draw < 0.7 else short)
            if token in vocab.stop_token_ids:
                jsonschema.validate(json.loads(vocab.hf_tokenizer.decode(tokens)), schema)
                completed += 1
                break
            assert ours_m.accept_token(token) and bare_m.accept_token(token)
            if theirs_m is not None and not theirs_m.accept_token(token):
                # llguidance's reading of the normalized pattern is narrower than the validator's
                # (a line break, ``$`` before a final one): compared up to here; validity is checked.
                theirs_m = None
            tokens.append(token)
    assert completed >= 5 and held > 0


def test_the_engine_runs_the_same_check_as_the_in_process_matcher(vocab) -> None:
    """The plugin's path without the engine: the wrapped grammar fills the rows the in-process
    matcher fills, and a code with no two digits in a row cannot be closed."""
    engine, local = engine_and_local(vocab, _normalized(CODE))
    refused = first_refused(vocab, engine, local, '{"code":"a1b2"}')
    assert refused is not None and '"' in refused, "a code without two digits was closed"
