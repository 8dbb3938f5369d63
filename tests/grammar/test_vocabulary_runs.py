"""A vocabulary's texts run through a pattern's automaton (``tokenmold.grammar.guards.vocabulary_runs``): where
each text leads from every state, over the trie's levels and over its tail, or by length and one
at a time (the texts apart), must be where the automaton leads it one character at a time."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest

from tokenmold.grammar.guards import vocabulary_runs
from tokenmold.grammar.guards.anchored_pattern import Automaton, automaton
from tokenmold.grammar.guards.vocabulary_runs import Runs, run_texts, trie

#: Few states (the tail runs text by text) and many (prefixes merged level by level to the end).
SMALL = "^[a-c]{2}-?[^x]*$"
LARGE = "^[ab.]{1,80}$"
#: Reads apart from the characters it does not name only a character few texts write.
APART = "^[^z]*z?[^z]{0,70}$"
#: Reads its literals apart, then, in its ``.*``, nothing (every text is run by its length from
#: there, the literals' states walk the trie); a search's first ``.*`` keeps every text going.
SPLIT = '^(?:ab\\.c|x-)"?.*$'
SEARCH = "^.*(?:ab|x-).*$"
#: Read one class only (``LARGE`` too): texts of it are run by their length, the others die; one
#: with a character beyond ASCII (run one at a time), one that dies within a few characters (the
#: trie drops the rest at once), one a little longer, and one as long that no text begins with.
CLASS = "^[a-cé.-]+$"
SHORT = "^[a-c]{2}$"
MIDDLE = "^[a-c]{6}$"
RARE = "^[0-9]{6}$"
#: Reads a newline apart, which kills from every state: the texts that write one are not run.
LINES = "^.{2,70}$"


def _texts(count: int, seed: int, alphabet: str = 'abc.-x"é') -> list[str]:
    rng = random.Random(seed)
    texts = ["", "a", "ab-", "z", "azb", "zz", "ab" * 20 + "z"]
    while len(texts) < count:  # long texts among short ones, on the pattern's characters mostly
        length = rng.choice([rng.randrange(6), rng.randrange(40)])
        texts.append("".join(rng.choice(alphabet) for _ in range(length)))
    return texts


def _check(machine: Automaton, texts: list[str], runs: Runs, settled: np.ndarray | None = None) -> None:
    """Each text ends where the automaton leads it; one ``settled`` marks, dead exactly where so."""
    ends = np.full((machine.dead + 1, len(texts)), machine.dead)
    ends[:, runs.texts] = runs.ends[:, runs.which]
    for number, text in enumerate(texts):
        for state in range(machine.dead + 1):
            reached = machine.run(state, text)
            if settled is not None and settled[number]:
                assert (ends[state, number] == machine.dead) == (reached == machine.dead), (state, text)
            else:
                assert ends[state, number] == reached, (state, text)
    assert len(set(runs.texts.tolist())) == len(runs.texts)  # each text ends once


@pytest.mark.parametrize("pattern", [SMALL, LARGE, APART, SPLIT, SEARCH, CLASS, SHORT, MIDDLE, RARE, LINES])
@pytest.mark.parametrize("count", [40, 6000])  # all in the tail; levels, then the tail
@pytest.mark.parametrize("apart", [True, False])  # texts apart run on their own where they may
def test_each_text_leads_where_the_automaton_leads_it(pattern, count, apart, monkeypatch) -> None:
    if not apart:
        monkeypatch.setattr(vocabulary_runs, "_APART_TEXTS", -1)
    ran: list[str] = []
    for name in ("_run_apart", "_joined"):
        original = getattr(vocabulary_runs, name)
        monkeypatch.setattr(
            vocabulary_runs, name, lambda *args, _run=original, _name=name: ran.append(_name) or _run(*args)
        )
    one_class, apart_of = vocabulary_runs._one_class, vocabulary_runs._apart
    monkeypatch.setattr(vocabulary_runs, "_one_class", lambda *args: ran.append("class") or one_class(*args))
    monkeypatch.setattr(vocabulary_runs, "_apart", lambda *args: _noted(apart_of(*args), ran))
    machine = automaton(pattern)
    assert machine is not None
    assert (machine.dead < 64) == (pattern in (SMALL, SPLIT, SEARCH, CLASS, SHORT, MIDDLE, RARE))
    # SPLIT's literals take few of many letters, so the trie drops most texts from their states.
    texts = _texts(count, count, string.ascii_letters + string.digits + '.-"é' if pattern == SPLIT else 'abc.-x"é')
    if pattern == LINES:  # one text in ten ends a line (fewer than 2,048: run apart)
        texts = [text + "\n" if number % 10 == 3 else text for number, text in enumerate(texts)]
    index: dict[str, int] = {}
    built = trie(texts, index)
    assert (built.tail_from == 0) == (count < 2048)
    lookup = np.array([0] + [machine.class_of(c) for c in index], dtype=np.int64)
    _check(machine, texts, run_texts(machine.moves, lookup, machine.rest, built))
    # Past 2,048 texts SMALL's named characters are in too many; LARGE drops any other at once;
    # past 2,048 only SPLIT's ``.*`` is run apart, its literals walk the trie.
    few = count < 2048
    by_class = pattern in (LARGE, CLASS, MIDDLE)  # SHORT's and RARE's are left to the trie
    assert ("class" in ran) == (pattern in (LARGE, CLASS, SHORT, MIDDLE, RARE))
    assert ("_run_apart" in ran) == (
        by_class or (apart and (pattern in (APART, SPLIT, LINES) or (few and pattern in (SMALL, SEARCH))))
    )
    assert ("_joined" in ran) == (apart and not few and pattern == SPLIT)
    # The newline kills from every state of LINES, and x from SMALL's ``[^x]*`` (run apart where few).
    assert ("dropped" in ran) == (apart and (pattern == LINES or (few and pattern == SMALL)))


def _noted(apart: vocabulary_runs._Apart, ran: list[str]) -> vocabulary_runs._Apart:
    """``apart``, noting in ``ran`` whether it drops texts (those that write a killing character)."""
    if apart.plain is not None:
        ran.append("dropped")
    return apart


@pytest.mark.parametrize("pattern", [SEARCH, SPLIT, "^#/.+/v$", LINES, SMALL])
@pytest.mark.parametrize("count", [40, 6000])
def test_settled_texts_lead_to_a_state_alive_as_the_one_they_reach(pattern, count, monkeypatch) -> None:
    """Where the caller asks only whether a text leaves the automaton alive (``settled``), the
    states only a character killing from all of them can kill (a search's; the ``.+`` after a
    literal) run the other texts alone: a settled text leads from them to a live state exactly
    where it reaches one, every other text where the automaton leads it. A count's states (LINES)
    and a class that kills some states only (SMALL's ``x``) are not such states."""
    ran: list[str] = []
    original = vocabulary_runs._settled
    monkeypatch.setattr(vocabulary_runs, "_settled", lambda *args: ran.append("settled") or original(*args))
    machine = automaton(pattern)
    assert machine is not None
    texts = _texts(count, count, 'abc.-x"é#/v\n')
    index: dict[str, int] = {}
    built = trie(texts, index)
    lookup = np.array([0] + [machine.class_of(c) for c in index], dtype=np.int64)
    settled = np.array([number % 7 != 2 for number in range(len(texts))])
    _check(machine, texts, run_texts(machine.moves, lookup, machine.rest, built, settled), settled)
    # Past 2,048 texts SEARCH's literals are read apart by too many for ``_wide``: its states are
    # run so; SPLIT's ``.*`` and the ``.+`` are ``_wide``'s too, which keeps them where it covers
    # as many states.
    if pattern == SEARCH and count > 2048:
        assert "settled" in ran
    assert "settled" not in ran or pattern in (SEARCH, SPLIT, "^#/.+/v$")
