"""Patterns as automata built by positions under a cap (``tokenmold.grammar.guards.automaton``):
the automaton takes exactly what the validator's regular expression matches whole, minimized or
not, and a pattern whose automaton would blow up is refused at the cap, quickly."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import regex

from tokenmold.grammar.guards import automaton
from tokenmold.grammar.guards.automaton import CharAutomaton, TooLarge, build, minimized
from tokenmold.grammar.guards.held_patterns import guarded

PATTERNS = [
    "([a-z0-9])+((-)?([a-z0-9])+)*",
    "(?:([a-z0-9])+((-)?([a-z0-9])+)*|(not-)?regex:(.*))",
    "([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)",
    "(ab\\..).*|.*(ab\\.c.).*|.*('.*')+",
    "[\\w\\.:-]+",
    "[0-9a-f]{2}-[0-9a-f]{1,3}",
    "a{2,5}b?",
    "(ab|a)*c",
    "(a|b{2})*",
    "[^\\s]{3,}",
    "x?",
    "",
    "(ab?|c){1,5}d?",  # optional copies that may be skipped, of a base that ends in two ways
    "[a.]{2,6}\\.?[a-c]{0,3}",
    "[a-c]{1,40}",
    # universal positions (final, followed only by themselves) next to positions that read more
    # than they do, or only what they do
    "(?:x[a-c]*|.*xb.*z)",
    "(?:.*ab.*|[^b]*\\n[a-c]*)",
    "(?:.*a.*|.*b.*|[a-c]*=)",
    "(?:[^a]*|.*b.*a)",
]
ALPHABET = "ab-c=+/0x.'\n Z_:é"


def _accepts(machine: CharAutomaton, text: str) -> bool:
    state: int | None = 0
    for char in text:
        state = machine.moves[state][machine.classes.get(char, machine.rest)]
        if state is None:
            return False
    return state in machine.finals


@pytest.mark.parametrize("core", PATTERNS)
def test_the_automaton_matches_what_the_validator_matches(core) -> None:
    built = build(core, 1200, 300)
    smaller = minimized(built)
    assert smaller.size <= built.size
    compiled = regex.compile(core, regex.ASCII)  # the automaton reads \w and \s as ASCII (documented)
    rng = random.Random(core)
    for _ in range(3000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(10)))
        if rng.random() < 0.3:  # walk into the pattern's own texts more often
            text = "ab.c" + text
        expected = compiled.fullmatch(text) is not None
        assert _accepts(built, text) == expected == _accepts(smaller, text), text


def test_a_search_merges_its_states_at_a_universal_position_and_minimizes() -> None:
    # Without merging, the construction builds 147 states here (a partial match of the second text
    # next to each full one) and minimizing leaves 55.
    built = build("(integration\\.response\\.header\\..).*|.*(integration\\.response\\.body\\..).*", 1200, 300)
    assert built.searched and built.size <= 61
    assert minimized(built).size == 55
    assert build("(?:.*a.*|.*b.*)", 1200, 300).size <= 5  # two universal positions, one state
    # a universal position alone in its states, or beside positions that read more: nothing merged
    assert not build("[a-z]+", 1200, 300).searched and not build("(?:x[a-c]*|.*xb.*z)", 1200, 300).searched


def _blocks(machine: CharAutomaton) -> int:
    """How many blocks Moore's partition has, found without hashing: the textbook rounds over
    whole rows, to compare ``minimized`` with."""
    block = [int(state in machine.finals) for state in range(machine.size)]
    while True:
        rows = [(block[s], *(-1 if m is None else block[m] for m in machine.moves[s])) for s in range(machine.size)]
        numbered = {row: i for i, row in enumerate(sorted(set(rows)))}
        if len(numbered) == len(set(block)):
            return len(numbered)
        block = [numbered[row] for row in rows]


@pytest.mark.parametrize(
    "core",
    [PATTERNS[3], "(integration\\.response\\.header\\..).*|.*(integration\\.response\\.body\\..).*", PATTERNS[14]],
)
def test_minimizing_merges_exactly_the_equivalent_states_even_when_every_hash_collides(core, monkeypatch) -> None:
    built = build(core, 1200, 300)
    blocks = _blocks(built)
    assert minimized(built).size == blocks
    # Every state hashed alike: the rounds end in one block, final states with the others; the
    # check finds that no congruence, and the rounds run again over whole rows.
    monkeypatch.setattr(automaton, "_hashed", lambda block, targets: np.zeros(len(block), dtype=np.uint64))
    collided = minimized(built)
    assert collided.size == blocks
    compiled = regex.compile(core, regex.ASCII)
    rng = random.Random(core)
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET + "intgrsponheadbdy") for _ in range(rng.randrange(40)))
        assert _accepts(collided, text) == (compiled.fullmatch(text) is not None), text


@pytest.mark.parametrize(
    ("core", "texts"),
    [
        # after "xb" the state holds [a-c]* (universal) and b, after which [^a] reads more than it
        ("(?:x[a-c]*|xb[^a]*)", ["xb", "xbz", "xbb", "xbzz", "xa", "xaz"]),
        # [a-c]* final and looping, but = may follow it: not universal, its state not shared
        ("(?:x[a-c]*=?|=[a-c]*)", ["=b", "=b=", "xb=", "x=", "=="]),
    ],
)
def test_merging_keeps_what_a_universal_position_does_not_take(core, texts) -> None:
    machine = build(core, 1200, 300)
    for text in texts:
        assert _accepts(machine, text) == (regex.fullmatch(core, text) is not None), text


@pytest.mark.parametrize("core", ["[ab]*a[ab]{20}", "(?:[ab]*a[ab]{40}|x)", "(a|b)*a(a|b){30}"])
def test_an_exponential_automaton_is_refused_at_the_cap_quickly(core) -> None:
    started = time.perf_counter()
    with pytest.raises(TooLarge):
        build(core, 1200, 300)
    assert time.perf_counter() - started < 5  # bounded by the cap, not by 2**20 states (a hang)


def test_caps_on_positions_and_constructs_it_does_not_build() -> None:
    with pytest.raises(TooLarge):
        build("a{1000}", 1200, 300)
    with pytest.raises(TooLarge):
        build("(?=ab)[a-z]{2}", 1200, 300)  # a lookahead
    with pytest.raises(TooLarge):
        build("(?i:ab)", 1200, 300)  # inline flags
    # as string patterns: a lazy quantifier reads differently in interegular, a backreference
    # and a boundary are not read at all
    assert not guarded("^(?:ab|c){2}?x$") and not guarded("^(?:a|b)\\1$") and not guarded("^(?:a|b)\\b$")
