"""The repetition guard: stop a generation caught in a loop.

A small model under a grammar can loop where the grammar leaves it free: measured with the embedded
model, ``"john_john_john_…"`` into an email string until ``max_tokens``, digits without end, or the
same array element (``"id", "id", "id", …``) appended for ever. The mask cannot stop that (every
step is valid), and the caller would wait for the whole budget, or the whole context when the
request sets none. The guard watches each output's token ids as the engine streams them: when the
last tokens are one exact cycle repeated often enough, and the place of that repeated stretch in
the output (``service/request/loop_sites.py``, per kind of output) says it is a loop, the runtime aborts
the output; its verdict is ``truncated`` with ``stop_reason: "repetition"`` and the error names
where (``LoopSite``).

Two rules, because what repeats legitimately differs by place:

- ``inside``: a cycle of at most ``max_period`` tokens repeated ``min_repeats`` times (at least
  ``min_tokens`` tokens in all) inside one JSON string or number (or key). Nothing in one value
  repeats like that on purpose, so this rule is quick.
- ``bare``: a cycle of at most ``bare_max_period`` tokens repeated ``bare_repeats`` times over at
  least ``bare_tokens`` tokens, wherever it lies: whole elements of one array repeating (equal
  numbers, identical objects), or the output of a grammar, a regex or free text, where no value
  bounds a place. Equal elements do repeat on purpose (``[0, 0, 0]``, a few equal objects), so
  this rule waits much longer: its threshold is about twice the repetition of the most
  repetitive output that ended well in the measurements (docs/benchmarks.md, "Repetition guard").

An exact cycle is required, so an object inventing distinct keys one after another is not caught.
Checking a token is O(``bare_max_period``): for each period the detector keeps how many
consecutive tokens equalled the token that many places back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: Where a loop found at the end of a text lies: the text so far, where the repeated stretch
#: starts in it, and the loop; ``None`` when that place does not make it a loop.
Locate = Callable[[str, int, "Loop"], "LoopSite | None"]


@dataclass(frozen=True)
class CycleRule:
    """How long a cycle must run to be a loop under one rule."""

    repeats: int
    max_period: int
    tokens: int
    #: The ``bare`` rule (see the module docstring), not ``inside``.
    bare: bool = False

    def length(self, period: int) -> int:
        """The tokens a cycle of ``period`` tokens must fill (the first cycle included)."""
        return max(self.repeats * period, self.tokens, period + 1)


@dataclass(frozen=True)
class RepetitionGuard:
    """When an output counts as looping (see the module docstring). The first three numbers are
    the ``inside`` rule's, and travel alone to the engine for budget fitting."""

    #: Repetitions of the cycle needed to call it a loop inside one value.
    min_repeats: int = 8
    #: The longest cycle looked for inside one value, in tokens.
    max_period: int = 16
    #: The repeated stretch inside one value must be at least this many tokens long (short cycles
    #: need more repeats).
    min_tokens: int = 32
    #: The ``bare`` rule: repetitions, longest cycle and fewest tokens of a loop not confined to one
    #: string or number.
    bare_repeats: int = 16
    bare_max_period: int = 64
    bare_tokens: int = 128

    def __post_init__(self) -> None:
        for repeats, period, tokens in ((self.min_repeats, self.max_period, self.min_tokens), self._bare_numbers):
            if repeats < 2 or period < 1 or tokens < 1:
                raise ValueError("repetition guard: repeats >= 2, a period >= 1 and tokens >= 1")

    @property
    def _bare_numbers(self) -> tuple[int, int, int]:
        return self.bare_repeats, self.bare_max_period, self.bare_tokens

    @property
    def inside(self) -> CycleRule:
        return CycleRule(self.min_repeats, self.max_period, self.min_tokens)

    @property
    def bare(self) -> CycleRule:
        return CycleRule(*self._bare_numbers, bare=True)

    def detector(self) -> RepetitionDetector:
        """A detector of the ``inside`` rule alone (budget fitting closes the value it finds)."""
        return RepetitionDetector((self.inside,))


@dataclass(frozen=True)
class Loop:
    """A cycle found at the end of an output."""

    period: int
    #: How many tokens at the end of the output repeat the cycle (the first cycle included).
    tokens: int
    #: The rule whose threshold it reached.
    rule: CycleRule
    #: The output's length in tokens when it was found (the stretch ends there).
    end: int

    @property
    def repeats(self) -> int:
        return self.tokens // self.period


@dataclass
class RepetitionDetector:
    """Fed one output's token ids in order; says when its tail is a cycle repeated enough times
    under each of ``rules``."""

    rules: tuple[CycleRule, ...]
    _tokens: list[int] = field(default_factory=list)
    #: Per period p (index p - 1): consecutive tokens so far equal to the token p places back.
    _runs: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self._runs = [0] * max(rule.max_period for rule in self.rules)

    def feed(self, token_ids: list[int]) -> list[Loop]:
        """Add ``token_ids``; the loops that reached a rule's threshold on the way (per rule and
        token, the shortest cycle)."""
        found: list[Loop] = []
        for token in token_ids:
            self._tokens.append(token)
            found += self._check(len(self._tokens) - 1)
        return found

    def _check(self, i: int) -> list[Loop]:
        """Reported once per periodic run and rule, when it first reaches the rule's threshold (a
        run that is not a loop where it lies, such as a short array of equal numbers, is not
        re-examined every token)."""
        tokens = self._tokens
        found: dict[CycleRule, Loop] = {}
        for period in range(1, len(self._runs) + 1):
            run = self._runs[period - 1] + 1 if i >= period and tokens[i] == tokens[i - period] else 0
            self._runs[period - 1] = run
            if not run:
                continue
            for rule in self.rules:
                if rule not in found and period <= rule.max_period and run + period == rule.length(period):
                    found[rule] = Loop(period, run + period, rule, i + 1)
        return list(found.values())

    @property
    def tokens(self) -> list[int]:
        return self._tokens


@dataclass(frozen=True)
class CallRef:
    """The tool call a loop is in."""

    index: int
    name: str | None


@dataclass(frozen=True)
class LoopSite:
    """Where the guard cut an output, as its verdict reports it."""

    #: JSON Pointer into the verdict's value (for tool calls, into the list of calls).
    path: str
    #: What holds the loop, in words ("inside this string", "in this array", "in the output").
    where: str
    loop: Loop
    #: The tool call holding the loop, if any.
    call: CallRef | None = None

    def message(self, completion_tokens: int) -> str:
        call = ""
        if self.call is not None:
            call = f" of call {self.call.index}" + (f" ({self.call.name})" if self.call.name else "")
        return (
            f"generation stopped after {completion_tokens} tokens: a cycle of {self.loop.period} tokens repeated "
            f"{self.loop.repeats} times {self.where}{call}; the output is incomplete"
        )


class LoopWatch:
    """The guard over every output of one request: ``feed`` each output's new token ids; it
    answers where the loop is, once ``locate`` places a loop found."""

    def __init__(self, guard: RepetitionGuard, decode: Callable[[list[int]], str], locate: Locate) -> None:
        self._rules = (guard.inside, guard.bare)
        self._decode = decode
        self._locate = locate
        self._detectors: dict[int, RepetitionDetector] = {}

    def feed(self, index: int, token_ids: list[int]) -> LoopSite | None:
        detector = self._detectors.setdefault(index, RepetitionDetector(self._rules))
        for loop in detector.feed(token_ids):
            text = self._decode(detector.tokens[: loop.end])
            stretch = self._decode(detector.tokens[loop.end - loop.tokens : loop.end])
            site = self._locate(text, len(text) - len(stretch), loop)
            if site is not None:
                return site
        return None
