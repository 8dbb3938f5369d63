"""Which string patterns the pattern guard holds, decided when a schema compiles.

The guard (``tokenmold.grammar.guards.anchored_pattern``) keeps a row of tokens per automaton state, so it
may only take a pattern whose automaton is small, and the decision is made at compile time, so it
must be cheap. Kinds held:

- string values whose pattern is a *line* (characters, classes and escapes in plain groups, fixed
  counts but the last) with a counted run, or with ``\\w``/``\\s``/``\\d`` (``guarded``):
  llguidance walks its token trie at every position near the end of a counted run, and reads those
  classes as Unicode. A line's automaton has about a state a position, so a cheap scan decides,
  and the automaton is built on first use;
- string values whose pattern is any other shape (alternations, quantified groups, branches
  anchored differently: slugs, base64, ``^(a)|(b)|(c)+$``) when its automaton is small: it is built
  here, by positions and under a cap (``tokenmold.grammar.guards.automaton``), since some such
  automata grow exponentially (``[ab]*a[ab]{20}``); interegular, building eagerly, would hang;
- the formats of ``tokenmold.grammar.guards.string_format``, whose automata are known;
- object keys whose one ``patternProperties`` pattern is a line, counted or not, or any other
  shape with a small automaton (``.*[0-9a-f]{32}.*``), in an object that lists no properties and
  takes no other keys (``key_pattern``): llguidance's key lexeme costs a slow mask at every
  position of such a key, many times a key of ``additionalProperties`` (docs/guards.md).

A search (``^.*X.*$``, how the normalizer writes an unanchored pattern) is the search guard's.
"""

from __future__ import annotations

import re
from functools import lru_cache

import interegular

from tokenmold.grammar.guards.automaton import CharAutomaton, build, minimized
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS
from tokenmold.grammar.guards.unanchored_pattern import searching

#: Automata with more states than this stay in llguidance's grammar (each state keeps a row:
#: 6 KB on the embedded vocabulary).
MOST_STATES = 300
#: The states a pattern's automaton may have as first built, before equivalent ones are merged.
MOST_BUILT = 4 * MOST_STATES
#: The formats' automata are larger (``hostname``: 125 states) and held all the same.
FORMAT_STATES = 1000
#: A counted repeat above this is left to llguidance: the automaton unrolls it.
_LARGEST_COUNT = 256
#: The formats' patterns, held whatever their shape (their automata are known to be small).
_FORMATS = frozenset(FORMAT_PATTERNS.values())


def guarded(pattern: object) -> bool:
    """Whether ``pattern`` (as normalized) is one this guard holds as a string's: ``^X$`` where
    ``X`` is a line with a counted run (``[0-9a-f]{8}-[0-9a-f]{4}``, ``[a-z_-]{1,64}``) or with a
    class llguidance reads as Unicode (``[\\w.:-]+``), a format's, or any other shape but a search
    whose automaton is small. Other lines stay with llguidance: there its own masks are as fast
    (its lexer meets the same states again and its slices cover them), and the guard's step would
    only add to them."""
    return isinstance(pattern, str) and _held(pattern) is not None and not searching(pattern)


@lru_cache(maxsize=4096)
def _held(pattern: str, key: bool = False) -> str | None:
    """``X`` of a ``^X$`` this guard holds, else ``None``: as a string's pattern (``guarded``: a
    format's, a line with a counted run, or any other shape but a line whose automaton is small) or,
    with ``key``, as a key pattern (``key_pattern``: a line, counted or not, a search for one
    counted character, or any other shape whose automaton is small)."""
    if len(pattern) < 2 or pattern[0] != "^" or not pattern.endswith("$") or pattern.endswith("\\$"):
        return None
    core = pattern[1:-1]
    if not key and pattern in _FORMATS:
        return core
    line = _positions(core, counted_only=False)
    if line is not None:  # its automaton has about a state a position: built on first use
        worth = key or _positions(core) is not None or _WIDE_CLASS.search(core) is not None
        held = line <= MOST_STATES and worth and _parses(core)
    else:  # built here, to learn whether it is small
        held = _plain_syntax(core) and char_automaton(core) is not None
    return core if held else None


def _parses(core: str) -> bool:
    try:
        interegular.parse_pattern(core)
    except Exception:  # interegular refuses what it does not know
        return False
    return True


@lru_cache(maxsize=1024)
def char_automaton(core: str) -> CharAutomaton | None:
    """The automaton of ``^core$`` (``tokenmold.grammar.guards.automaton``) with at most
    ``MOST_STATES`` states (a format's: ``FORMAT_STATES``), minimized where the construction built
    more or merged a search's states (each state the guard keeps costs it a row to build, about
    what Moore's rounds cost for the whole automaton); ``None`` past that, past ``MOST_BUILT``
    states or ``MOST_STATES`` positions as built, or where interegular cannot parse it."""
    most = FORMAT_STATES if f"^{core}$" in _FORMATS else MOST_STATES
    try:
        built = build(core, max(most, MOST_BUILT), max(most, MOST_STATES))
    except Exception:  # TooLarge, or interegular refuses what it does not know
        return None
    if built.size > MOST_STATES or built.searched:  # a search builds its texts' prefixes more than once
        built = minimized(built)
    return built if built.size <= most else None


def _plain_syntax(core: str) -> bool:
    """Whether ``core`` uses only what interegular and the validator read alike: known escapes,
    plain groups, greedy quantifiers (interegular reads ``a{2}?`` as an optional ``a{2}``)."""
    at = 0
    while at < len(core):
        char = core[at]
        if char == "[":
            end = _class_end(core, at)
        elif char == "\\":
            end = _escape_end(core, at)
        elif core.startswith("(?", at):
            end = at + 3 if core.startswith("(?:", at) else None
        else:
            quantifier = _QUANTIFIER.match(core, at)
            end = at + 1 if quantifier is None else quantifier.end()
            if quantifier is not None and core[end : end + 1] in ("?", "+"):
                return False
        if end is None:
            return False
        at = end
    return True


#: ``\w``, ``\s``, ``\d`` and their negations, which llguidance reads as Unicode classes: its
#: lexer then walks a large byte automaton at every new state (slow masks in MaskBench's
#: ``o82674``, ``^[\w\s-]+$``), where the guard reads them as ASCII (``anchored_pattern``).
_WIDE_CLASS = re.compile(r"(?<!\\)(?:\\\\)*\\[wWsSdD]")
#: A quantifier: ``{n}``, ``{m,n}``, ``{m,}``, ``*``, ``+`` or ``?``.
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}|[*+?]")
#: Escapes of a character or a class that interegular and the validator read alike in ASCII.
_CLASS_ESCAPES = frozenset("dDwWsStnrfv")


def _positions(core: str, counted_only: bool = True) -> int | None:
    """How many character positions ``core`` unrolls to when it is a line of single characters,
    classes and escapes (in plain groups) with fixed counts, of which only the last may vary, and
    some count is 2 or more: its automaton is then about a state per position, built in linear
    time. ``None`` for any other shape (an alternation, a count that varies before the end, a lazy
    quantifier, a lookaround, an anchor or a backreference): their automata may grow
    exponentially (``[ab]*a[ab]{20}``), and llguidance builds its own lazily."""
    at, counted, varied = 0, False, False
    sizes = [0]  # positions so far in each open group, outermost first
    while at < len(core):
        char = core[at]
        if varied and char != ")":
            return None  # something after the part that varies
        if char == "(":
            if core.startswith("(?:", at):
                at += 3
            elif core.startswith("(?", at):
                return None
            else:
                at += 1
            sizes.append(0)
            continue
        if char == ")":
            if len(sizes) == 1:
                return None
            size, at = sizes.pop(), at + 1
        elif char == "[":
            end = _class_end(core, at)
            if end is None:
                return None
            size, at = 1, end
        elif char == "\\":
            end = _escape_end(core, at)
            if end is None:
                return None
            size, at = 1, end
        elif char in "|*+?{}^$":
            return None
        else:
            size, at = 1, at + 1
        quantifier = _QUANTIFIER.match(core, at)
        if quantifier is not None:
            if varied or core[quantifier.end() : quantifier.end() + 1] in ("?", "+"):
                return None  # a count on what varies, a lazy or possessive quantifier
            low, comma, high = quantifier.groups()
            fixed = low is not None and comma is None
            most = int(low) if fixed else int(high) if high else 1
            if most > _LARGEST_COUNT:
                return None
            counted = counted or most >= 2
            varied = not fixed
            size *= max(most, 1)
            at = quantifier.end()
        sizes[-1] += size
    return sizes[0] if (counted or not counted_only) and len(sizes) == 1 else None


def _class_end(core: str, at: int) -> int | None:
    """Where the class opening at ``at`` ends (past its ``]``; ``None``: a nested or unclosed one)."""
    at += 1
    if core.startswith("^", at):
        at += 1
    if core.startswith("]", at):
        at += 1
    while at < len(core):
        if core[at] == "\\":
            end = _escape_end(core, at)
            if end is None:
                return None
            at = end
        elif core[at] == "]":
            return at + 1
        elif core[at] == "[":
            return None
        else:
            at += 1
    return None


def _escape_end(core: str, at: int) -> int | None:
    """Where the escape at ``at`` ends (``None``: one this guard does not read)."""
    if at + 1 >= len(core):
        return None
    escaped = core[at + 1]
    if escaped in "ux":
        digits = 4 if escaped == "u" else 2
        hexa = core[at + 2 : at + 2 + digits]
        return at + 2 + digits if len(hexa) == digits and all(c in "0123456789abcdefABCDEF" for c in hexa) else None
    if escaped.isalnum() and escaped not in _CLASS_ESCAPES:
        return None  # a backreference, a boundary, \p{...}, \A
    return at + 2


def held_core(pattern: str) -> str | None:
    """``X`` of a ``^X$`` the guard holds, as a string's pattern, a format's or a key pattern."""
    return _held(pattern) or _held(pattern, key=True)


def key_pattern(pattern: object) -> str | None:
    """``pattern`` when the guard holds it as the one ``patternProperties`` pattern of an object
    that lists no properties (``None`` otherwise): a line, counted or not, or any other shape
    whose automaton is small (``.*[0-9a-f]{32}.*``). Next to listed names the automaton's alphabet splits into a class a
    letter, and building its rows took seconds for two names, an order of magnitude more than the
    pattern alone."""
    if not isinstance(pattern, str):
        return None
    return pattern if _held(pattern, key=True) is not None else None
