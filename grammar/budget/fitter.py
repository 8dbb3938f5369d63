"""The budget-fitting mask: at every step, only tokens after which the output can still close in time.

Opt-in per request (``budget: "fit"``). It runs next to the grammar's matcher, after the grammar
(and the duplicate-key guard) filled the row: for each token the grammar allows, the tokens the
cheapest valid completion needs after it (``Tracker.plan``, tokenized at its cheapest) must fit the
tokens left, keeping one for the end-of-sequence token. A token that would not fit is removed.
So optional members stop being opened, arrays close once ``minItems`` holds, strings and numbers
end, and required content comes in its shortest form when nothing else fits.

Not every token is tried one by one: inside a string, content tokens (no quote, no backslash)
change the plan only by how many characters they add toward a ``minLength``, so they are priced by
their length (one trial per length); in a key, content tokens that continue no listed name all
lead to the same plan (an extra key). Trials are cached per position (``Fitting.trials``), so the
requests of one shape share them.

The repetition guard (``service/request/repetition.py``) runs here too in fit mode: a loop inside one value
switches the output to closing (every step must lower the cost), so the value ends, the output
closes and the verdict lists the value in ``cut`` instead of truncating.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from tokenmold.grammar.bitmask_rows import allowed_tokens, any_set, clear_packed, clear_tokens, pack, token_bits
from tokenmold.grammar.budget.floor import fewest_tokens, spelling_ends
from tokenmold.grammar.budget.schema import FitSchema
from tokenmold.grammar.budget.string_content import ShapedContent, shaped
from tokenmold.grammar.budget.tracker import Arr, Free, Num, Obj, Str, Text, Tracker, is_content
from tokenmold.grammar.vocabulary import llguidance_tokens

#: More allowed tokens than this outside a string are not tried one by one (the step is left to
#: the grammar); in practice a JSON position outside strings allows a few hundred at most.
MAX_TRIALS = 4096
#: Positions whose trials are kept per shape.
MAX_CACHED_POSITIONS = 20_000
#: The cost of a token after which the tracker has no plan: never fits.
UNPLANNED = 1 << 30
#: Content tokens are grouped by length up to this many characters (longer ones share a group).
MAX_CHARS = 64
#: A plan longer than this is priced by its cheapest spelling alone (tokenizing it costs more).
MAX_TOKENIZED = 20_000


class TokenTable:
    """Token bytes by id and their classes, built once per vocabulary (in the engine and for the
    verdict's replay): ``content`` tokens can only extend a string (``is_content``), ``chars``
    counts their characters, ``special`` ones (control tokens, end of sequence) are
    never removed."""

    def __init__(
        self, tokens: Iterable[tuple[int, bytes, bool]], size: int, tokenize: Callable[[bytes], list[int]] | None = None
    ) -> None:
        self.size = size
        #: The grammar engine's own tokenization of forced text (``None``: the cheapest is used).
        self.tokenize = tokenize
        self.by_id: list[bytes] = [b""] * size
        self.special: np.ndarray = np.ones(size, dtype=bool)
        self.content: np.ndarray = np.zeros(size, dtype=bool)
        self.chars: np.ndarray = np.zeros(size, dtype=np.int32)
        for token, data, special in tokens:
            if special or not data or token >= size:
                continue
            self.by_id[token] = data
            self.special[token] = False
            if is_content(data):
                self.content[token] = True
                self.chars[token] = sum((b & 0xC0) != 0x80 for b in data)
        words = (size + 31) // 32
        #: Packed like a bitmask row: every ordinary token, the content tokens, and the content
        #: tokens of exactly ``n`` (``chars_bits[n]``) and of at least ``n`` characters.
        self.ordinary = pack(~self.special, words)
        self.content_bits = pack(self.content, words)
        lengths = np.minimum(self.chars, MAX_CHARS)
        self.chars_bits = [pack(self.content & (lengths == n), words) for n in range(MAX_CHARS + 1)]
        self.chars_at_least = [pack(self.content & (lengths >= n), words) for n in range(MAX_CHARS + 1)]
        #: Ordinary tokens that are not content: tried one by one inside a string.
        self.structural = np.flatnonzero(~self.special & ~self.content)
        self.content_ids = np.flatnonzero(self.content)
        #: The spellings, for the cheapest tokenization of a plan (``budget.fewest_tokens``).
        self.spelled_tokens: dict[bytes, list[int]] = {}
        for token, data in enumerate(self.by_id):
            if data:
                self.spelled_tokens.setdefault(data, []).append(token)
        self.longest_spelling = max(map(len, self.spelled_tokens), default=1)
        self.spelling_ends = spelling_ends(self.spelled_tokens)

    @classmethod
    def from_llguidance(cls, ll_tokenizer: Any) -> TokenTable:
        return cls(llguidance_tokens(ll_tokenizer), ll_tokenizer.vocab_size, ll_tokenizer.tokenize_bytes)


class Fitting:
    """What every request of one shape shares: the schema view, plan costs and cached trials."""

    def __init__(self, schema: dict[str, Any] | bool, table: TokenTable) -> None:
        self.schema = FitSchema(schema)
        self.table = table
        self.content = ShapedContent(table.by_id, table.content, table.chars)
        self._costs: dict[bytes, int] = {}
        #: Per position (``_position``), the cost after each token tried there.
        self.trials: dict[Any, Trials] = {}

    def position(self, key: Any) -> Trials:
        """The trials of one position, created empty (all of them dropped past a bound)."""
        found = self.trials.get(key)
        if found is None:
            if len(self.trials) >= MAX_CACHED_POSITIONS:
                self.trials.clear()
            found = self.trials[key] = Trials()
        return found

    @cached_property
    def trigger_tokens(self) -> np.ndarray:
        """The tokens that can complete the trigger of free text before a call (``tool_choice:
        auto``): those holding its last byte."""
        calls = self.schema.calls
        last = calls.trigger[-1:] if calls is not None else b""
        return _ids([token for token, data in enumerate(self.table.by_id) if last and last in data])

    def cost(self, plan: bytes) -> int:
        """The tokens ``plan`` takes: as the grammar engine tokenizes it where it can (llguidance
        lets only that spelling through wherever the grammar forces the bytes, such as a required
        key written in order: ``n``, ``erv``, ``ous`` where ``nerv``, ``ous`` would be one fewer),
        and never fewer than its cheapest spelling."""
        found = self._costs.get(plan)
        if found is None:
            found = fewest_tokens(plan, self.table)
            tokenize = self.table.tokenize
            if tokenize is not None and len(plan) <= MAX_TOKENIZED:
                found = max(found, len(tokenize(plan)))
            self._costs[plan] = found
        return found


@dataclass
class Trials:
    """The costs after the tokens tried at one position, the tokens with a plan among them, and the
    highest of their costs: a step whose allowed tokens all have a plan here, none above the limit,
    needs no trial at all."""

    costs: dict[int, int] = field(default_factory=dict)
    planned: set[int] = field(default_factory=set)
    highest: int = 0


@dataclass(frozen=True)
class Narrowing:
    """A step at which the budget removed tokens the grammar allowed, and what was open then."""

    step: int
    #: The string or number being written (the budget shortened it), if any.
    innermost: str | None
    #: Pointers of the arrays open then (the budget may have stopped them early).
    arrays: tuple[str, ...]
    #: Per open object, its optional listed members not written yet (it may have left them out).
    optional: tuple[tuple[str, tuple[str, ...]], ...]


class LoopDetector(Protocol):
    """``service.repetition.RepetitionDetector``: the loops an output's tail reached."""

    def feed(self, token_ids: list[int]) -> list[Any]: ...


@dataclass
class Fitter:
    """One output's budget: feed it the accepted tokens, ask which allowed tokens to remove."""

    fitting: Fitting
    #: Tokens the engine may still generate (max_tokens, less the forced prefix).
    left: int
    #: The repetition guard's detector; a loop inside one value makes the output close.
    detector: LoopDetector | None = None
    #: The pointer of the value a loop was found in: from then on every token must lower the cost.
    looping_at: str | None = None
    tracker: Tracker = field(init=False)
    steps: int = 0
    narrowed: list[Narrowing] = field(default_factory=list)
    #: The step at which the string or number being written began (a loop must lie inside it).
    _value_start: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        self.tracker = Tracker(self.fitting.schema)

    def feed_prefix(self, tokens: Iterable[int]) -> None:
        """Tokens the output starts with that the budget does not pay for (the forced prefix)."""
        for token in tokens:
            self.tracker = self.tracker.feed(self.fitting.table.by_id[token])

    def feed(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.accept(token)

    def accept(self, token: int) -> None:
        self.tracker = self.tracker.after_token(self.fitting.table, token)
        self.left -= 1
        self.steps += 1
        top = self.tracker.top
        scalar = top.pointer if isinstance(top, (Str, Num)) else None
        if scalar is None:
            self._value_start = None
        elif self._value_start is None or self._value_start[0] != scalar:
            self._value_start = (scalar, self.steps - 1)
        if self.detector is not None and self.looping_at is None:
            loops = self.detector.feed([token])
            start = self._value_start
            if start is not None and any(self.steps - loop.tokens >= start[1] for loop in loops):
                self.looping_at = start[0]

    def restrict(self, words: np.ndarray) -> bool:
        """Clear, in one bitmask row the grammar filled (int32 words, 32 tokens a word), the bits of
        the tokens that would not fit; whether any was cleared (the step is then in ``narrowed``)."""
        tracker, table = self.tracker, self.fitting.table
        plan = tracker.plan()
        if plan is None:
            return False
        now = self.fitting.cost(plan)
        limit = self.left - 2  # after this token, and one token kept for the end of sequence
        if self.looping_at is not None:
            limit = min(limit, now - 1)
        top = tracker.top
        if isinstance(top, Free):
            return self._free_text(words, tracker, limit)
        removed = False
        original = words.copy()
        if isinstance(top, Str) and not top.text.open and shaped(top):
            removed = self._shaped_content(words, tracker, limit)
            tried = table.structural[token_bits(words, table.structural)]
        elif isinstance(top, Str) and not top.text.open and all(c.values is None for c in top.cands):
            removed = self._string_content(words, tracker, now, limit)
            tried = table.structural[token_bits(words, table.structural)]
        else:
            tried = allowed_tokens(words, table.size)
            tried = tried[~table.special[tried]]
            if isinstance(top, Obj) and top.phase == "in_key" and not top.key.open:
                content = table.content[tried]
                removed = clear_tokens(words, self._key_content(tracker, tried[content], limit))
                tried = tried[~content]
        if len(tried) <= MAX_TRIALS:
            trials = self.fitting.position(_position(tracker))
            tokens = tried.tolist()
            if trials.highest > limit or not trials.planned.issuperset(tokens):
                bad = [t for t in tokens if self._trial(trials, t) > limit]
                removed = clear_tokens(words, _ids(bad)) or removed
        return self._settled(words, original, removed)

    def _settled(self, words: np.ndarray, original: np.ndarray, removed: bool) -> bool:
        """Whether the step's row was narrowed (then recorded); where nothing would be left (a plan
        the grammar does not allow), the grammar's row stands, and the output may end truncated
        rather than stuck."""
        if removed and not any_set(words):
            words[:] = original
            return False
        if removed:
            self._record()
        return removed

    def _free_text(self, words: np.ndarray, tracker: Tracker, limit: int) -> bool:
        """Free text may end anywhere, so only the tokens that complete the trigger (a call then
        begins, and must close in time) are tried; with no room but for the end of sequence, every
        ordinary token goes."""
        table = self.fitting.table
        original = words.copy()
        if limit < 0:
            removed = clear_packed(words, table.ordinary)
        else:
            tried = self.fitting.trigger_tokens
            trials = self.fitting.position(_position(tracker))
            bad = [t for t in tried[token_bits(words, tried)].tolist() if self._trial(trials, t) > limit]
            removed = clear_tokens(words, _ids(bad))
        return self._settled(words, original, removed)

    def _string_content(self, words: np.ndarray, tracker: Tracker, now: int, limit: int) -> bool:
        """Clear the content tokens of a string that do not fit, priced by their length: the plan
        changes only by the filler a ``minLength`` still needs."""
        top = tracker.top
        assert isinstance(top, Str)
        table = self.fitting.table
        need = min(max(int(c.schema.get("minLength", 0)) for c in top.cands) - top.text.chars, MAX_CHARS)
        if need <= 0:
            return now > limit and clear_packed(words, table.content_bits)
        removed = False
        for n in range(1, need + 1):
            plan = tracker.feed(b"a" * n).plan()
            if plan is None or self.fitting.cost(plan) > limit:
                removed = clear_packed(words, table.chars_bits[n] if n < need else table.chars_at_least[n]) or removed
        return removed

    def _shaped_content(self, words: np.ndarray, tracker: Tracker, limit: int) -> bool:
        """Clear the content tokens of a pattern's, a format's or an enum-or-text string that do not
        fit, one plan per group of tokens that lead to the same plan (``string_content``)."""
        top = tracker.top
        assert isinstance(top, Str)
        table = self.fitting.table
        tokens = table.content_ids[token_bits(words, table.content_ids)]
        bad = []
        for group in self.fitting.content.groups(top, tokens):
            plan = tracker.extend(table.by_id[group.first], int(table.chars[group.first])).plan()
            if plan is None or self.fitting.cost(plan) > limit:
                bad.append(group.tokens)
        return bool(bad) and clear_tokens(words, np.concatenate(bad))

    def _key_content(self, tracker: Tracker, tokens: np.ndarray, limit: int) -> np.ndarray:
        """Of the content tokens a key allows, those that do not fit: the ones that continue a
        listed name are tried one by one; the rest all lead to one plan (an extra key), priced by the
        first of them the tracker can follow."""
        top = tracker.top
        assert isinstance(top, Obj)
        names = [n.encode() for c in top.cands for n in c.schema.get("properties", {}) if n not in top.keys]
        raw, by_id = top.key.raw, self.fitting.table.by_id
        trials = self.fitting.position(_position(tracker))
        bad, other_cost = [], None
        for token in tokens.tolist():
            written = raw + by_id[token]
            if any(n.startswith(written) or written.startswith(n) for n in names):
                cost = self._trial(trials, token)
            else:
                if other_cost is None and self.tracker.feed(by_id[token]).plan() is not None:
                    other_cost = self._trial(trials, token)
                cost = other_cost if other_cost is not None else self._trial(trials, token)
            if cost > limit:
                bad.append(token)
        return _ids(bad)

    def _trial(self, trials: Trials, token: int) -> int:
        """The cost after ``token`` from this position (cached in ``trials``); a token after which
        the tracker has no plan is priced out (``restrict`` keeps the grammar's row whole if that
        would leave nothing)."""
        found = trials.costs.get(token)
        if found is None:
            plan = self.tracker.feed(self.fitting.table.by_id[token]).plan()
            found = trials.costs[token] = self.fitting.cost(plan) if plan is not None else UNPLANNED
            if plan is not None:
                trials.planned.add(token)
                trials.highest = max(trials.highest, found)
        return found

    def _record(self) -> None:
        values = self.tracker.open_values()
        innermost = values[-1].pointer if values and isinstance(values[-1], (Str, Num)) else None
        arrays = tuple(v.pointer for v in values if isinstance(v, Arr))
        optional = tuple((v.pointer, _optional_names(v)) for v in values if isinstance(v, Obj))
        self.narrowed.append(Narrowing(self.steps, innermost, arrays, optional))


def _optional_names(frame: Obj) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for cand in frame.cands:
        required = set(cand.schema.get("required", ()))
        names.update((n, None) for n in cand.schema.get("properties", {}) if n not in required and n not in frame.keys)
    return tuple(names)


def _ids(tokens: list[int]) -> np.ndarray:
    out: np.ndarray = np.array(tokens, dtype=np.int64)
    return out


def _position(tracker: Tracker) -> Any:
    """What a trial's cost depends on: the stack, with a plain string's text reduced to what its
    plan reads (its length up to ``minLength`` and an open escape), so a string's trials are shared
    by all its steps."""
    top = tracker.top
    if isinstance(top, Str) and all(c.values is None for c in top.cands) and not shaped(top):
        need = max(int(c.schema.get("minLength", 0)) for c in top.cands)
        reduced = top._replace(text=Text(b"", min(top.text.chars, need), top.text.escape, top.text.pending))
        return (*tracker.stack[:-1], reduced)
    return tracker.stack
