"""Anchored patterns with a counted run (``tokenmold.grammar.guards.anchored_pattern``): such strings compile
without their pattern and the bound guard ANDs the row of the state their content reached in the
pattern's automaton. Checked token by token against the validator's own regular expressions
(partial matches), against llguidance with the pattern in its grammar on random walks through the
real vocabulary (the same rows), and on the engine's path (``vllm_plugin``)."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import numpy as np
import pytest
import regex
import torch
from support.guard_paths import engine_and_local, first_refused

from tokenmold.grammar.backends.base import JsonOptions
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend
from tokenmold.grammar.bitmask_rows import allowed_tokens
from tokenmold.grammar.budget.tracker import Obj, Str
from tokenmold.grammar.guards import anchored_pattern
from tokenmold.grammar.guards.anchored_pattern import _CLOSE, _EXTEND, _OPEN_ESCAPE, _read, automaton
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.grammar.guards.held_patterns import guarded
from tokenmold.grammar.jsonschema.normalize import normalize_schema

ID = "^[0-9a-f]{4}-[0-9a-f]{2}$"
ITEM = {"type": "object", "properties": {"id": {"type": "string", "pattern": ID}}, "required": ["id"]}
IDS = {"type": "array", "items": {"type": "string", "pattern": ID}, "minItems": 2, "maxItems": 3}
LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


SLUG = "^([a-z0-9])+((-)?([a-z0-9])+)*$"
BASE64 = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$"


#: A pattern whose branches are anchored differently, as the normalizer writes it (MaskBench's
#: ``o21850``: ``^(a\..)|(a\.c.)|('.*')+$``).
BRANCHES = "^(?:(ab\\..).*|.*(ab\\.c.).*|.*('.*')+)$"


def _normalized(schema):
    return normalize_schema(schema).schema


def test_anchored_patterns_with_a_counted_run_or_a_small_automaton_leave_the_grammar() -> None:
    assert guarded(ID) and guarded("^[0-9A-Za-z]{8}-[0-9A-Za-z]{12}$") and guarded("^(?:ab){2}c[0-9]{0,3}$")
    assert guarded("^[0-9a-zA-Z_-]{1,255}$") and guarded("^\\d{3}\\.[^\\]x]{2}$")
    assert not guarded("^[a-z0-9]+$")  # no counted run: llguidance is as fast
    assert not guarded("^.*[0-9]{2}.*$")  # a search: the search guard's
    assert not guarded("^[a-z]{2}") and not guarded("^(?=ab)[a-z]{2}$") and not guarded("^\\p{L}{2}$")
    assert not guarded("^(\\d)\\1{2}$") and not guarded("^\\b[a-z]{2}$") and not guarded("^a{2}?$")
    # Other shapes when their automaton is small (MaskBench's slug, base64 and a search in a branch).
    assert guarded("^(?:ab|c){2,5}x$") and guarded("^[0-9]+-[0-9]{2}$") and guarded(SLUG) and guarded(BASE64)
    assert guarded(BRANCHES)
    # Automata that grow exponentially or pass the cap; a line past a state a position.
    assert not guarded("^[ab]*a[ab]{20}$") and not guarded("^(?:[ab]*a[ab]{20}|x)$")
    assert not guarded("^(?:[ab]*a[ab]{8}|x)$")  # 512 states even minimized: over the 300 kept
    assert not guarded("^a{1000}$") and not guarded("^[a-z]{200}[0-9]{200}$")
    stripped = strip_bounds(_normalized(ITEM))
    assert stripped.anchored == 1 and "pattern" not in stripped.schema["properties"]["id"]
    assert strip_bounds({"type": "string", "pattern": ID, "maxLength": 3}).anchored == 0
    assert strip_bounds({"type": "string", "pattern": ID, "format": "uuid"}).anchored == 0


@pytest.mark.parametrize(
    "pattern",
    # Few texts get past the first state (rows from their tokens alone) or most do (rows gathered
    # from every token's), in up to eight rows or more (``^[a-z0-9-]{1,12}$``); texts run by their
    # length but the few with a newline (``^.{2,40}$``); from states only a newline kills, the
    # texts that stay inside the string judged alive without being run (``BRANCHES``, the ``.+``
    # after ``#/``, ``^.*\w[-\w_]*$``).
    [
        ID,
        "^(?:ab){2}c[0-9]{0,3}$",
        "^[A-Z]{2}[^ab]{3}\\.[0-9]{1,2}$",
        SLUG,
        BASE64,
        BRANCHES,
        "^[a-z0-9-]{1,12}$",
        "^.{2,40}$",
        "^#/.+/ab$",
        "^.*\\w[-\\w_]*$",
    ],
)
def test_each_row_keeps_the_tokens_the_validator_lets_go_on(vocab, pattern) -> None:
    """For contents reached by random walks of the pattern's characters, a token's bit is whether
    the validator's regular expression can still match the content with the token's text (a
    partial match), or, for a token that closes the string, matches it whole; a token that leaves
    an escape or a character open is judged up to there."""
    rng = random.Random(pattern)
    compiled = regex.compile(pattern[1:-1])
    alphabet = "abcx0123456789ABCZ-. +/='"
    contents = []
    for _ in range(6):
        content = ""
        for _ in range(rng.randrange(5)):
            extended = content + rng.choice(alphabet)
            if compiled.fullmatch(extended, partial=True):
                content = extended
        contents.append(content)
    _check_rows(vocab, pattern, contents, rng)


def test_states_that_judge_every_token_alike_share_a_row(vocab) -> None:
    """A count's states farther from its end than the longest token allow the same tokens: they
    share one row, and every state's row, shared or not, is still the validator's."""
    pattern = "^[a-z0-9 ]{1,40}$"
    rows = vocab.bound_table.patterns.rows(pattern)
    assert rows is not None
    assert len(rows.rows) < rows.machine.dead == 41
    _check_rows(vocab, pattern, ["a1 " * (n // 3) + "x" * (n % 3) for n in range(41)], random.Random(7))


def _check_rows(vocab, pattern: str, contents: list[str], rng: random.Random) -> None:
    tokens = vocab.bound_table.patterns
    rows = tokens.rows(pattern)
    machine = automaton(pattern)
    assert rows is not None and machine is not None
    compiled = regex.compile(pattern[1:-1])
    spelling = vocab.bound_table.by_id
    judged = tokens.ids.tolist()
    sample = rng.sample(judged, 2500) + [t for t in judged if b'"' in spelling[t] or b"\\" in spelling[t]]
    for content in contents:
        state = machine.run(machine.initial, content)
        allowed = set(allowed_tokens(rows.row(state), vocab.vocab_size).tolist())
        for token in sample:
            read = _read(spelling[token])
            assert read is not None
            text, mode = read
            if mode == _CLOSE:
                expected = compiled.fullmatch(content + text) is not None
            elif mode == _EXTEND:
                expected = compiled.fullmatch(content + text, partial=True) is not None
            else:  # open at its end: what it completes is checked at the next step
                # an escape writes a quote, a backslash or a control character (a slash or any
                # other character neither llguidance nor this guard lets begin), a UTF-8
                # sequence a character beyond ASCII
                sample_chars = '"\\\n\t\x01' if mode == _OPEN_ESCAPE else "\u00e9\u4e2d"
                expected = any(compiled.fullmatch(content + text + c, partial=True) for c in sample_chars)
            assert (token in allowed) == expected, (content, spelling[token], mode)


@pytest.mark.parametrize("pattern", ["^[A-Z]{2}[^ab]{3}\\.[0-9]{1,2}$", BRANCHES])
def test_after_a_backslash_the_row_keeps_the_escapes_that_go_on(vocab, pattern) -> None:
    """Where the pattern takes characters JSON escapes (a quote, a newline), a token that follows
    an open backslash is judged by what the completed escape and the rest of it write."""
    tokens = vocab.bound_table.patterns
    rows, machine = tokens.rows(pattern), automaton(pattern)
    assert rows is not None and machine is not None
    compiled = regex.compile(pattern[1:-1])
    spelling = vocab.bound_table.by_id
    for content in ("", "AB", "AB'x", "ab.c"):
        state = machine.run(machine.initial, content)
        if state == machine.dead:
            continue
        allowed = set(allowed_tokens(rows.row(state, escaping=True), vocab.vocab_size).tolist())
        for token in tokens.escape_ids.tolist():
            text, mode = _read(b"\\" + spelling[token])
            if mode == _CLOSE:
                expected = compiled.fullmatch(content + text) is not None
            elif mode == _EXTEND:
                expected = compiled.fullmatch(content + text, partial=True) is not None
            else:
                continue  # left open again (a \\u escape): judged as the rows judge it
            assert (token in allowed) == expected, (content, spelling[token])


def _llguidance(vocab, schema):
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps({**schema, "x-guidance": LAYOUT}))
    return LLGuidanceBackend(vocab).compile_grammar(grammar)


@pytest.mark.parametrize("schema", [ITEM, IDS], ids=["object", "array"])
def test_the_guarded_mask_is_llguidances_and_every_walk_ends_valid(vocab, schema) -> None:
    """The guard allows what llguidance allows with the pattern in its grammar; walks that prefer
    the pattern's characters and quotes all end valid."""
    check_walks_against_llguidance(vocab, schema, b"0123456789abcdef-")


@pytest.mark.parametrize("pattern", [SLUG, BASE64, BRANCHES], ids=["slug", "base64", "branches"])
def test_patterns_that_are_not_lines_walk_as_in_llguidance(vocab, pattern) -> None:
    """Held for their small automata (``tokenmold.grammar.guards.automaton``): the same walks."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}, "required": ["v"]}
    check_walks_against_llguidance(vocab, schema, b"ab-.c'0+/=", steps=150)


def check_walks_against_llguidance(vocab, schema, likely: bytes, steps: int = 60) -> None:
    """Eight random walks through the guarded grammar of ``schema`` and llguidance's with every
    bound in it, drawing quotes, tokens of ``likely`` characters or any allowed token: the guarded
    mask allows all llguidance allows, inside the guarded strings and keys nothing more but closing quotes
    (after which llguidance, forcing the bytes that follow, keeps only its own spelling of them:
    ``":"`` and not ``":``), and at least half the walks end valid."""
    normalized = _normalized(schema)
    guarded_grammar = LLGuidanceBackend(vocab).compile_json_schema(normalized, JsonOptions())
    assert guarded_grammar.bounds is not None and "pattern" not in guarded_grammar.grammar
    reference = _llguidance(vocab, normalized)
    spelling = vocab.bound_table.by_id
    # What each draw looks for, per token, worked out once rather than at every step.
    quoting = [b'"' in text for text in spelling]
    stops = set(vocab.stop_token_ids)
    of_likely = [bool(text) and all(c in likely for c in text) for text in spelling]
    rng = random.Random(7)
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    completed = inside = 0
    for _ in range(8):
        ours_m, theirs_m = guarded_grammar.matcher(), reference.matcher()
        tokens: list[int] = []
        for _ in range(steps):
            ours_m.fill_next_token_bitmask(rows, 0)
            theirs_m.fill_next_token_bitmask(rows, 1)
            ours, theirs = (set(allowed_tokens(rows[i].numpy(), vocab.vocab_size).tolist()) for i in (0, 1))
            assert theirs <= ours, vocab.hf_tokenizer.decode(tokens)
            top = ours_m._guard.tracker.top
            if isinstance(top, Str) or (isinstance(top, Obj) and top.phase == "in_key"):
                # llguidance may spell forced bytes its own way
                assert all(b'"' in spelling[t] for t in ours - theirs), vocab.hf_tokenizer.decode(tokens)
                inside += 1
            quotes = [t for t in ours if quoting[t] or t in stops]
            common = [t for t in ours if of_likely[t]]
            draw = rng.random()
            token = rng.choice(quotes if quotes and draw < 0.3 else common if common and draw < 0.9 else sorted(ours))
            if token in vocab.stop_token_ids:
                jsonschema.validate(json.loads(vocab.hf_tokenizer.decode(tokens)), schema)
                completed += 1
                break
            assert ours_m.accept_token(token) and theirs_m.accept_token(token)
            tokens.append(token)
    assert completed >= 4 and inside > 30


def test_a_token_that_opens_a_patterned_string_must_begin_a_match(vocab) -> None:
    """``"ab`` after a key opens the string and writes into it at once (where a number may come
    too, so that the quote is not forced): it goes where the pattern cannot begin with its text,
    and stays where it can."""
    spelling = vocab.bound_table.by_id
    opening = [t for t in vocab.bound_table.patterns.open_ids.tolist() if spelling[t][:1] == b'"']
    path = "^[./][0-9a-f]{2,4}$"  # SmolLM2 has ``".`` and ``"/``, and no quote before a letter
    either = {"type": "object", "properties": {"id": {"type": ["string", "integer"], "pattern": path}}}
    compiled = LLGuidanceBackend(vocab).compile_json_schema(_normalized(either), JsonOptions())
    assert compiled.bounds is not None and "pattern" not in compiled.grammar
    matcher = compiled.matcher()
    for token in vocab.encode('{"id":'):
        assert matcher.accept_token(token)
    row = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    matcher.fill_next_token_bitmask(row)
    allowed = set(allowed_tokens(row[0].numpy(), vocab.vocab_size).tolist())
    begins = regex.compile(path[1:-1])
    kept = [t for t in opening if t in allowed]
    # ``"\\`` goes: its escape could only write ``\\/``, which llguidance never writes
    written = [spelling[t][1:].decode() for t in kept]
    assert len(kept) >= 2 and all(begins.fullmatch(text, partial=True) for text in written)
    assert any(
        t not in allowed for t in opening if not begins.fullmatch(spelling[t][1:].decode("latin-1"), partial=True)
    )


def test_the_engine_runs_the_same_check_as_the_in_process_matcher(vocab) -> None:
    """The plugin's path without the engine: the wrapped grammar fills the rows the in-process
    matcher fills, and an id off the pattern cannot be written."""
    engine, local = engine_and_local(vocab, _normalized(ITEM))
    refused = first_refused(vocab, engine, local, '{"id":"12g4-56"}')
    assert refused is not None and "g" in refused


def test_rows_are_kept_within_their_budget(vocab, monkeypatch) -> None:
    """Past ``KEPT_BYTES`` the least recently built pattern's rows go (and are built again when
    met again); the one just built always stays."""
    tokens = vocab.bound_table.patterns
    first, second = "^[0-9]{2}x[a-f]{3}$", "^[a-f]{2}y[0-9]{3}$"
    built = tokens.rows(first)
    assert built is not None
    monkeypatch.setattr(anchored_pattern, "KEPT_BYTES", built.rows.nbytes + 1)
    assert tokens.rows(second) is not None
    assert second in tokens._rows and first not in tokens._rows
    again = tokens.rows(first)
    assert again is not None and np.array_equal(again.rows, built.rows)
