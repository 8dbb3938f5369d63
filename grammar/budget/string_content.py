"""Content tokens of a string whose plan depends on more than its length, grouped by that plan.

Inside a plain string the fitter prices content tokens by how many characters they add
(``Fitter._string_content``). Inside a string held by a pattern or a format
(``tokenmold.grammar.budget.patterns``), or one that may still be an enum member or free text, the
plan depends on the automaton state the token reaches, or on the enum members it still
continues: up to every token of the vocabulary is allowed there (a search pattern ``^.*X.*$``),
and planning each one would cost a second a step. So tokens are keyed by what the plan reads, per
candidate of the string: the automaton state reached and the characters written (up to
``minLength``, exactly under a ``maxLength``), the characters of a plain candidate up to its
``minLength``, the token itself where it continues an enum member; one token per key is planned.
A pattern's next states are kept per (pattern, state), filled for the tokens met.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from tokenmold.grammar.budget.patterns import StringRule, Unplannable, decoded, string_rule
from tokenmold.grammar.budget.tracker import Str, _json

#: (pattern rule, state) pairs whose next states are kept per shape (an int32 per token each).
MOST_KEPT = 256
_UNKNOWN = -2


class Group(NamedTuple):
    """Tokens that lead to one plan, and one of them to plan with."""

    first: int
    tokens: np.ndarray


class ShapedContent:
    """Per shape: the decoded text of every content token and the kept next states."""

    def __init__(self, by_id: list[bytes], content: np.ndarray, chars: np.ndarray) -> None:
        self.by_id = by_id
        self.content = content
        self.chars = chars
        self._texts: list[str] | None = None
        self._states: dict[tuple[int, int], np.ndarray] = {}
        self._keep: list[StringRule] = []

    def groups(self, top: Str, tokens: np.ndarray) -> Iterator[Group]:
        """``tokens`` (content tokens allowed inside ``top``) grouped by the plan they lead to."""
        text = top.text
        added = self.chars[tokens].astype(np.int64)
        columns = []
        for cand in top.cands:
            values = cand.values
            if values is not None:
                columns.append(self._enum_column(text.raw, values, tokens))
                continue
            try:
                rule = string_rule(cand.schema)
            except Unplannable:  # no plan at all: the tracker prices every token out
                columns.append(np.full(len(tokens), -1, dtype=np.int64))
                continue
            if rule is None:
                low = int(cand.schema.get("minLength", 0))
                columns.append(np.minimum(text.chars + added, low))
                continue
            state = rule.machine.run(0, decoded(text.raw))
            columns.append(self._next_states(rule, state, tokens))
            written = text.chars + added
            columns.append(written if rule.high is not None else np.minimum(written, rule.low))
        keys = np.stack(columns, axis=1) if columns else np.zeros((len(tokens), 1), dtype=np.int64)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        edges = [0, *np.cumsum(np.bincount(inverse, minlength=len(first))).tolist()]
        for group, at in enumerate(first.tolist()):
            yield Group(int(tokens[at]), tokens[order[edges[group] : edges[group + 1]]])

    def _enum_column(self, raw: bytes, values: list[Any], tokens: np.ndarray) -> np.ndarray:
        """The token itself where it continues a member (each plans alone), else ``-1``."""
        written = (_json(v)[1:-1].encode() for v in values if isinstance(v, str))
        rests = [w[len(raw) :] for w in written if w.startswith(raw)]
        out: np.ndarray = np.full(len(tokens), -1, dtype=np.int64)
        for i, token in enumerate(tokens.tolist()):
            data = self.by_id[token]
            if any(rest.startswith(data) for rest in rests):
                out[i] = token
        return out

    def _next_states(self, rule: StringRule, state: int, tokens: np.ndarray) -> np.ndarray:
        key = (id(rule), state)
        states = self._states.get(key)
        if states is None:
            if len(self._states) >= MOST_KEPT:
                self._states.clear()
                self._keep.clear()
            states = self._states[key] = np.full(len(self.by_id), _UNKNOWN, dtype=np.int32)
            self._keep.append(rule)  # its id stays its own while the states are kept
        found = states[tokens]
        unknown = tokens[found == _UNKNOWN]
        if len(unknown):
            texts, run = self.texts, rule.machine.run
            states[unknown] = [run(state, texts[t]) for t in unknown.tolist()]
            found = states[tokens]
        out: np.ndarray = found.astype(np.int64)
        return out

    @property
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [
                d.decode("utf-8", "replace") if c else "" for d, c in zip(self.by_id, self.content, strict=True)
            ]
        return self._texts


def shaped(top: Str) -> bool:
    """Whether a string's plan reads more than its length: a pattern or format, or enum members
    next to free text (an enum alone allows few tokens: they are tried one by one)."""
    plain = [c for c in top.cands if c.values is None]
    return any("pattern" in c.schema or "format" in c.schema for c in plain) or (
        bool(plain) and len(plain) < len(top.cands)
    )
