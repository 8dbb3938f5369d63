"""The shortest text a string with a ``pattern`` or a ``format`` can still be finished with.

Budget fitting prices every position by its shortest valid completion, and a string whose grammar
holds a pattern (``^[0-2][0-9]:[0-5][0-9]$``), a format (``date-time``) or both cannot close on
``minLength`` filler: the grammar refuses ``"aa"``. Here the string's language is a character
automaton (``tokenmold.grammar.guards.automaton``: the pattern guard's construction, with caps
of its own), intersected with the lengths, and the completion from a state is a shortest path to a
final one: the distances to a final state are taken once per automaton and ``minLength`` (a
backward breadth-first search over (state, characters written up to ``minLength``)), and the path
is read greedily, at each step the first class in a fixed preference order whose move lowers the
distance by one. Reading it so makes the completion the preference-least shortest one, so a prefix
of it leads to a state whose completion is the rest: the consistency the fitter's mask relies on
(``tokenmold.grammar.budget.tracker``'s docstring). Each class is written as one representative
character: one JSON writes unescaped and that tokenizes alone (letters, then digits from ``1``:
a date's year ``0000`` is valid for the grammar but not for Python's date parser, which the
validator uses), else a JSON escape.

The formats are the ones the grammar enforces (``GRAMMAR_FORMATS``), as llguidance writes them
(1.7.6, ``parser/src/json/formats.rs``); three of them are the pattern guard's already
(``tokenmold.grammar.guards.string_format``). interegular, which reads the patterns, builds no
automaton lazily and has no shortest-path search, hence this module. A string whose automaton
cannot be built under the caps (or that is no ``^X$``) has no ``StringRule``: a shape holding one
is refused for fitting up front (``tokenmold.grammar.budget.coverage``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from tokenmold.grammar.guards.automaton import CharAutomaton, build, minimized
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS, plain

#: States an automaton of a fitted string may have (the pattern guard holds up to 300; the fitter
#: only reads distances, a few integers a state).
MOST_STATES = 5000
#: States of (automaton state, characters up to ``minLength``) the distances may cover.
MOST_PAIRS = 400_000

_DATE = (
    r"(?:[0-9]{4}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01]))|"
    r"(?:[0-9]{4}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30))|"
    r"(?:[0-9]{4}-02-(?:0[1-9]|1[0-9]|2[0-9]))"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_DAY = (
    r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|"
    r"(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|(?:02)-(?:0[1-9]|1[0-9]|2[0-9]))"
)
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DURATION = (
    r"P(?:(?:[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:"
    + _DUR_TIME
    + r")?|"
    + _DUR_TIME
    + r"|[0-9]+W)"
)
_OCTET = r"(?:[0-9]|[1-9][0-9]|25[0-5]|2[0-4][0-9]|1[0-9][0-9])"
_H = r"[0-9a-fA-F]{1,4}"
_LS32 = rf"{_H}:{_H}"
_IPV6 = "|".join(
    (
        rf"(?:{_H}:){{7}}{_H}",
        rf"::(?:{_H}:){{0,5}}{_LS32}",
        rf"(?:{_H})?::(?:{_H}:){{0,4}}{_LS32}",
        rf"(?:(?:{_H}:){{0,1}}{_H})?::(?:{_H}:){{0,3}}{_LS32}",
        rf"(?:(?:{_H}:){{0,2}}{_H})?::(?:{_H}:){{0,2}}{_LS32}",
        rf"(?:(?:{_H}:){{0,3}}{_H})?::{_H}:{_LS32}",
        rf"(?:(?:{_H}:){{0,4}}{_H})?::{_LS32}",
        rf"(?:(?:{_H}:){{0,5}}{_H})?::{_H}",
        rf"(?:(?:{_H}:){{0,6}}{_H})?::",
    )
)

#: Every format the grammar enforces, as the anchored pattern of the strings llguidance admits.
FORMATS: dict[str, str] = {
    **FORMAT_PATTERNS,
    "date": plain(_DATE),
    "time": plain(_TIME),
    "date-time": plain(_DAY + "[tT]" + _TIME),
    "duration": plain(_DURATION),
    "ipv4": plain(rf"(?:{_OCTET}\.){{3}}{_OCTET}"),
    "ipv6": plain(_IPV6),
    "uuid": plain(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
}

#: The characters a class is written as, best first: they write unescaped in JSON and are one
#: token each in common vocabularies.
_PREFERRED = "abcdefghijklmnopqrstuvwxyz123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0-_.:/ ,;+@#!$%&'()*<=>?[]^`{|}~"
#: Characters beyond ASCII tried for the class of characters a pattern does not name.
_WIDE = "éüñßøλж中"
#: What may follow a backslash in a JSON string, and the character it writes.
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "/": "/"}
_UNREACHABLE = 1 << 30


class Machine(NamedTuple):
    """A string's language: a character automaton (``moves[state][cls]``, ``-1``: no move), the
    written form of each class's representative (``None``: no character of it can be written),
    and the classes in the order the shortest completion prefers them."""

    moves: list[list[int]]
    finals: list[bool]
    classes: dict[str, int]
    rest: int
    written: list[str | None]
    order: list[int]

    def class_of(self, char: str) -> int:
        return self.classes.get(char, self.rest)

    def run(self, state: int, text: str) -> int:
        """The state after ``text`` from ``state`` (``-1``: no match can go on)."""
        for char in text:
            if state < 0:
                return -1
            state = self.moves[state][self.classes.get(char, self.rest)]
        return state


@dataclass(frozen=True, eq=False)
class StringRule:
    """A string's pattern or format (their intersection where it has both) and lengths."""

    machine: Machine
    low: int
    high: int | None

    @cached_property
    def distances(self) -> list[list[int]]:
        """Per state, per characters written (capped at ``low``): the fewest characters to a final
        state with at least ``low`` written."""
        return _distances(self.machine, self.low)

    def completion(self, state: int, chars: int) -> str | None:
        """The shortest text that finishes a string in ``state`` with ``chars`` characters written
        (its written form, JSON escapes included), or ``None`` where none can."""
        if state < 0:
            return None
        machine, distances, low = self.machine, self.distances, self.low
        written = min(chars, low)
        left = distances[state][written]
        if left >= _UNREACHABLE or (self.high is not None and chars + left > self.high):
            return None
        out = []
        while left:
            written = min(written + 1, low)
            for cls in machine.order:
                target = machine.moves[state][cls]
                if target >= 0 and distances[target][written] == left - 1:
                    out.append(machine.written[cls] or "")
                    state, left = target, left - 1
                    break
        return "".join(out)

    @cached_property
    def shortest(self) -> str | None:
        """The shortest string this rule admits, decoded (the floor's)."""
        found = self.completion(0, 0)
        return None if found is None else json.loads(f'"{found}"')

    def finish(self, raw: bytes, chars: int, escape: int, pending: int) -> bytes | None:
        """The shortest bytes that finish (not close) a string written so far as ``raw``: an open
        escape or UTF-8 sequence completed with a character the rule takes, then ``completion``."""
        if not (escape or pending):
            state = self.machine.run(0, decoded(raw))
            found = self.completion(state, chars)
            return None if found is None else found.encode()
        cut = raw.rfind(b"\\") if escape else _lead(raw)
        state = self.machine.run(0, decoded(raw[:cut]))
        if state < 0:
            return None
        best: bytes | None = None
        for tail, char in _open_options(raw[cut:], escape, pending, self.machine):
            # A UTF-8 sequence's character was counted at its first byte, an escape's is not yet.
            rest = self.completion(self.machine.run(state, char), chars + (not pending))
            if rest is not None and (best is None or len(tail) + len(rest) < len(best)):
                best = tail + rest.encode()
        return best


def string_rule(schema: dict[str, Any]) -> StringRule | None:
    """The rule of a string schema with a ``pattern`` or an enforced ``format`` (``None`` for one
    with neither); ``Unplannable`` with the reason where its automaton cannot be had."""
    pattern, form = schema.get("pattern"), schema.get("format")
    if form not in FORMATS:
        form = None
    if pattern is None and form is None:
        return None
    high = schema.get("maxLength")
    found = _rule(pattern, form, int(schema.get("minLength", 0)), None if high is None else int(high))
    if isinstance(found, str):
        raise Unplannable(found)
    return found


class Unplannable(Exception):
    """A string's pattern whose shortest completions cannot be planned (the reason)."""


@lru_cache(maxsize=1024)
def _rule(pattern: str | None, form: str | None, low: int, high: int | None) -> StringRule | str:
    """The rule, or why there is none (cached too: a pattern too large is slow to find so)."""
    try:
        machines = [_machine(p) for p in (pattern, FORMATS.get(form or "")) if p is not None]
        machine = machines[0] if len(machines) == 1 else _product(*machines)
    except Unplannable as exc:
        return str(exc)
    if len(machine.moves) * (low + 1) > MOST_PAIRS:
        return f"minLength {low} on a pattern of {len(machine.moves)} states"
    return StringRule(machine, low, high)


@lru_cache(maxsize=256)
def _machine(pattern: str) -> Machine:
    if len(pattern) < 2 or not pattern.startswith("^") or not pattern.endswith("$") or pattern.endswith("\\$"):
        raise Unplannable(f"pattern {pattern!r} is not anchored at both ends")
    try:
        built = build(pattern[1:-1], MOST_STATES, MOST_STATES)
    except Exception as exc:  # TooLarge, or a construct interegular does not read
        raise Unplannable(f"pattern {pattern!r}: {exc or type(exc).__name__}") from None
    if built.searched:
        built = minimized(built)
    return _arrays(built)


def _arrays(built: CharAutomaton) -> Machine:
    moves = [[-1 if target is None else target for target in row] for row in built.moves]
    finals = [state in built.finals for state in range(len(moves))]
    return _with_representatives(moves, finals, built.classes, built.rest)


def _with_representatives(moves: list[list[int]], finals: list[bool], classes: dict[str, int], rest: int) -> Machine:
    count = len(moves[0]) if moves else 0
    chosen: dict[int, tuple[int, str]] = {}
    candidates = list(_PREFERRED) + sorted(classes) + list(_WIDE) + [chr(c) for c in range(0x20)] + ['"', "\\"]
    for rank, char in enumerate(candidates):
        if char in _WIDE and char in classes:
            continue  # stands for the characters the pattern does not name
        cls = classes.get(char, rest)
        if cls not in chosen:
            chosen[cls] = (rank, json.dumps(char, ensure_ascii=False)[1:-1])
    written = [chosen[c][1] if c in chosen else None for c in range(count)]
    order = sorted(chosen, key=lambda c: chosen[c][0])
    return Machine(moves, finals, classes, rest, written, order)


def _product(first: Machine, second: Machine) -> Machine:
    """The intersection of two machines (a pattern and a format on one string)."""
    named = set(first.classes) | set(second.classes)
    pairs: dict[tuple[int, int], int] = {(first.rest, second.rest): 0}
    classes = {}
    for char in sorted(named):
        pair = (first.class_of(char), second.class_of(char))
        classes[char] = pairs.setdefault(pair, len(pairs))
    number = {(0, 0): 0}
    states = [(0, 0)]
    moves: list[list[int]] = []
    while len(moves) < len(states):
        a, b = states[len(moves)]
        row = []
        for ca, cb in pairs:
            target = (first.moves[a][ca], second.moves[b][cb])
            if target[0] < 0 or target[1] < 0:
                row.append(-1)
                continue
            if target not in number:
                if len(states) >= MOST_STATES:
                    raise Unplannable("a pattern and a format whose intersection is too large")
                number[target] = len(states)
                states.append(target)
            row.append(number[target])
        moves.append(row)
    finals = [first.finals[a] and second.finals[b] for a, b in states]
    return _with_representatives(moves, finals, classes, 0)


def _distances(machine: Machine, low: int) -> list[list[int]]:
    """Breadth-first from the final states backwards over (state, min(characters, low))."""
    states = len(machine.moves)
    back: list[list[int]] = [[] for _ in range(states)]
    for state, row in enumerate(machine.moves):
        for target in {row[cls] for cls in machine.order}:  # only classes a character is written for
            if target >= 0:
                back[target].append(state)
    distances = [[_UNREACHABLE] * (low + 1) for _ in range(states)]
    queue: deque[tuple[int, int]] = deque()
    for state in range(states):
        if machine.finals[state]:
            distances[state][low] = 0
            queue.append((state, low))
    while queue:
        state, written = queue.popleft()
        step = distances[state][written] + 1
        # A move into ``written`` came from ``written - 1``, or from ``low`` itself at the cap.
        if written == low:
            sources: tuple[int, ...] = (low - 1, low) if low else (0,)
        else:
            sources = (written - 1,) if written else ()
        for before in sources:
            for source in back[state]:
                if distances[source][before] > step:
                    distances[source][before] = step
                    queue.append((source, before))
    return distances


def decoded(raw: bytes) -> str:
    """A string's characters written so far as ``raw`` (JSON escapes read; no open one)."""
    try:
        return str(json.loads(b'"' + raw + b'"'))
    except ValueError:
        return "\x00\x00"  # no machine here takes two NULs: the string is read as dead


def _lead(raw: bytes) -> int:
    """Where the UTF-8 sequence left open at the end of ``raw`` begins."""
    at = len(raw) - 1
    while at > 0 and raw[at] & 0xC0 == 0x80:
        at -= 1
    return at


def _open_options(head: bytes, escape: int, pending: int, machine: Machine) -> Iterable[tuple[bytes, str]]:
    """The ways to complete an open escape or UTF-8 sequence ``head``: the bytes still due and the
    character they make (only characters the machine names, or one representative of the rest)."""
    if pending:
        for char in [*machine.classes, *_WIDE, head.decode("utf-8", "replace")]:
            data = char.encode()
            if len(data) > len(head) and data.startswith(head):
                yield data[len(head) :], char
        return
    if escape == -1:
        for letter, char in _SHORT_ESCAPES.items():
            yield letter.encode(), char
        for code in range(0x20):
            yield f"u{code:04x}".encode(), chr(code)
        return
    digits = head[2:].decode().lower()
    for code in [*range(0x80), *(ord(c) for c in machine.classes if ord(c) < 0x10000)]:
        spelled = f"{code:04x}"
        if spelled.startswith(digits):
            yield spelled[len(digits) :].encode(), chr(code)
