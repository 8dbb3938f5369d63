"""Unanchored string patterns enforced next to llguidance instead of inside it.

JSON Schema's ``pattern`` is a search: ``\\d{4}-\\d{2}`` matches any text that contains such a
date. A pattern with no ``^`` can begin its match anywhere, so every text is the beginning of some
matching text (write the match after it): inside such a string any content is allowed, and only
the closing quote depends on the pattern. llguidance, given the pattern, builds the search as a
lexeme whose states are unions of all the partial matches in flight, and its token-trie walk has no
shortcut for them: on MaskBench's `Github_easy---o12621` a mask costs two orders of magnitude more
than in the same string without the pattern (docs/guards.md, "What each guard holds").

So such strings compile without their ``pattern`` (``tokenmold.grammar.guards.held_keywords.strip_bounds``) and
this mask puts it back on the bound guard's tracker: the tokens that close the string (a quote,
after content or not; 163 of SmolLM2's 49,152) stay allowed only where the content they complete
contains a match, searched with the validation layer's regular expressions
(``tokenmold.grammar.jsonschema.regex``), so the mask and the verdict agree. Once the content holds
a match that no later character can undo (no ``$``, lookahead or word boundary in the pattern),
nothing is checked any more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple

import interegular
import numpy as np
import regex
from interegular.fsm import anything_else

from tokenmold.grammar.bitmask_rows import clear_unless_emptied, keep_unless_emptied, pack_ids, token_bits
from tokenmold.grammar.guards.item_count import closing_quote
from tokenmold.grammar.jsonschema.regex import PatternError, compile_pattern

#: Constructs after which a longer text may lose the match a shorter one had.
_FRAGILE = ("$", "(?=", "(?!", "\\b", "\\B")
#: Constructs whose match depends on the text before it.
_LOOKING_BACK = ("(?<", "\\b", "\\B")
#: How the normalizer writes a pattern with no ``^`` (``regex.grammar_pattern``): ``^.*X.*$``, or
#: ``^.*X$`` when it ends with ``$``.
_LEAD, _TAIL = "^.*", ".*$"
#: Above this many closer contents left to search, the row is asked first which are allowed.
_FEW_GROUPS = 4
#: JSON string content that reads as written: printable ASCII but the quote and the backslash.
_PLAIN = regex.compile(rb"[\x20\x21\x23-\x5b\x5d-\x7e]*")
#: The characters ``Searcher.last_chars`` answers for.
_PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))


def searching(pattern: object) -> bool:
    """Whether ``pattern`` (as normalized) may begin its match anywhere: ``^.*`` and no other ``^``
    (a negated class included: the test stays simple and errs towards leaving a pattern to
    llguidance), and it compiles."""
    if not isinstance(pattern, str) or not pattern.startswith(_LEAD) or "^" in pattern[1:]:
        return False
    try:
        _searcher(pattern)
    except PatternError:
        return False
    return True


@lru_cache(maxsize=1024)
def _searcher(pattern: str) -> Searcher:
    """What the guard searches for a normalized ``^.*X.*$`` (or ``^.*X$``): ``X`` (or ``X$``), as
    the validator searches the schema's own pattern (the normalizer's leading ``.*`` does not cross
    a line break, which would leave a text with one no way to close), and whether a match survives
    any longer text."""
    body = pattern[len(_LEAD) :]
    closed = body.endswith(_TAIL) and not body.endswith("\\" + _TAIL)
    core = body[: -len(_TAIL)] if closed else body
    lasting = closed and not any(mark in core for mark in _FRAGILE)
    looks_back = any(mark in core for mark in _LOOKING_BACK)
    compiled = compile_pattern(core)
    return Searcher(compiled, lasting, looks_back, _last_chars(core) if lasting and not looks_back else None)


class Searcher(NamedTuple):
    regex: regex.Pattern[str]
    #: Once the text holds a match, every longer text does too.
    lasting: bool
    #: Whether a match may depend on the text before it (lookbehind, word boundaries).
    looks_back: bool
    #: The printable ASCII characters a match can end with (``None``: unknown, or any).
    last_chars: frozenset[str] | None


def _last_chars(core: str) -> frozenset[str] | None:
    """The printable ASCII characters a match of ``core`` can end with, read off interegular's
    automaton of it (the labels of the transitions into its final states); ``None`` where it cannot
    parse ``core`` or a match may end with any character. Only the printable ASCII range is
    answered: there interegular's classes (``\\d``, ``\\w``, ``.``) mean what the validator's mean,
    and a closer writing anything else is always searched."""
    try:
        fsm = interegular.parse_pattern(core).to_fsm()
    except Exception:  # interegular's parser refuses what it does not know (\\p{...}, lookarounds)
        return None
    into_final = {label for moves in fsm.map.values() for label, state in moves.items() if state in fsm.finals}
    mapping = fsm.alphabet._symbol_mapping
    if mapping.get(anything_else) in into_final:
        return None
    return frozenset(
        c for c, label in mapping.items() if isinstance(c, str) and c in _PRINTABLE and label in into_final
    )


class Closers:
    """Per vocabulary: the tokens that close a string read in plain text, and for each the content
    it writes before the quote (as an index into ``contents``: about 60 distinct ones)."""

    def __init__(self, tokens: Iterable[tuple[int, bytes]], words: int) -> None:
        tokens_list = list(tokens)
        found = sorted((token, data[:at]) for token, data in tokens_list if (at := closing_quote(data)) is not None)
        self.contents: list[bytes] = sorted({content for _, content in found})
        #: Each content as text where it is plain ASCII without escapes (``None``: decode in place).
        self.texts: list[str | None] = [c.decode() if c.isascii() and b"\\" not in c else None for c in self.contents]
        #: The tokens that open a string and close it too (``":"``): the quote opening it, and the
        #: content between.
        self.whole: dict[int, tuple[int, bytes]] = {}
        for token, data in tokens_list:
            opened = data.find(b'"')
            closed = closing_quote(data[opened + 1 :]) if opened >= 0 else None
            if closed is not None:
                self.whole[token] = (opened, data[opened + 1 : opened + 1 + closed])
        self.whole_ids = np.array(sorted(self.whole), dtype=np.int64)
        #: Every token with a quote in it, and its bytes: where a string's content so far ends in an
        #: open escape or a split character the plain reading above does not hold (after a
        #: backslash, ``"]["`` escapes its first quote and closes the string with its last).
        quoted = sorted((token, data) for token, data in tokens_list if b'"' in data)
        self.quoted_ids = np.array([token for token, _ in quoted], dtype=np.int64)
        self.quoted: list[bytes] = [data for _, data in quoted]
        index = {content: i for i, content in enumerate(self.contents)}
        self.ids = np.array([token for token, _ in found], dtype=np.int64)
        self.group = np.array([index[content] for _, content in found], dtype=np.int64)
        self._alone: dict[str, np.ndarray] = {}
        self._completing: dict[str, np.ndarray] = {}
        #: Rows of ``words`` words: every bit set but the closers', and the bits of ``whole``.
        self.kept = ~pack_ids(self.ids, words)
        self.whole_row = pack_ids(self.whole_ids, words)

    def present(self, words: np.ndarray) -> np.ndarray:
        """Per content, whether a token writing it and its quote is allowed in the row."""
        present: np.ndarray = np.zeros(len(self.contents), dtype=bool)
        present[self.group[token_bits(words, self.ids)]] = True
        return present

    def completing(self, pattern: str, searcher: Searcher) -> np.ndarray:
        """Per content, whether it may complete a match the text before it started (memoized per
        pattern). Once the text holds no match, a lasting pattern's new match ends inside the
        content the closer writes: a plain printable ASCII content with no character a match can
        end with cannot complete one. Any other content (empty, escaped, beyond ASCII) is always
        searched."""
        found = self._completing.get(pattern)
        if found is None:
            last = searcher.last_chars
            found = np.array(
                [
                    last is None or not text or not set(text) <= _PRINTABLE or not last.isdisjoint(text)
                    for text in ("" if t is None else t for t in self.texts)
                ]
            )
            self._completing[pattern] = found
        return found

    def alone(self, pattern: str, searcher: Searcher) -> np.ndarray:
        """Per content, whether it holds a match by itself (memoized per pattern)."""
        found = self._alone.get(pattern)
        if found is None:
            texts = [t if t is not None else decoded(c) for t, c in zip(self.texts, self.contents, strict=True)]
            found = np.array([t is not None and searcher.regex.search(t) is not None for t in texts])
            self._alone[pattern] = found
        return found


class Scan(NamedTuple):
    """How far the search in one open string got, so the next step reads only what was added:
    its content as written and decoded, and per pattern where a match may still begin (before
    that position no match can begin however the string goes on)."""

    raw: bytes
    content: str
    starts: tuple[int, ...]


def restrict_closing(
    raw: bytes, patterns: list[str], closers: Closers, words: np.ndarray, before: Scan | None = None
) -> Scan | None:
    """Inside a string whose content so far is ``raw`` (as written, escapes kept), clear the tokens
    that would close it with no match of any of ``patterns`` in its content. Returns where the
    search got (``before``, this string's previous one, lets it start there), or ``None`` once the
    content holds a match no later character can undo (the caller need not look again in this
    string). A row is never emptied."""
    if before is not None and not raw.startswith(before.raw):
        before = None  # another string (the same pointer again): its scan starts afresh
    content = _extended(before, raw)
    if content is None:  # an escape or a character split across tokens
        _restrict_unread(raw, patterns, closers, words)
        return before if before is not None else Scan(b"", "", (0,) * len(patterns))
    searchers = [_searcher(p) for p in patterns]
    starts = before.starts if before is not None else (0,) * len(patterns)
    if any(s.lasting and s.regex.search(content, at) for s, at in zip(searchers, starts, strict=True)):
        return None
    partials = [s.regex.search(content, at, partial=True) for s, at in zip(searchers, starts, strict=True)]
    scan = Scan(raw, content, tuple(len(content) if p is None else p.start() for p in partials))
    matched: np.ndarray = np.zeros(len(closers.contents), dtype=bool)
    present: np.ndarray | None = None
    for pattern, searcher, partial, start in zip(patterns, searchers, partials, scan.starts, strict=True):
        # A match the closing token completes starts where the content's first partial match
        # does; with none, within the token's own content (known per pattern).
        if partial is None and not searcher.looks_back:
            matched |= closers.alone(pattern, searcher)
            continue
        search, texts = searcher.regex.search, closers.texts
        groups = np.flatnonzero(~matched & closers.completing(pattern, searcher))
        if len(groups) > _FEW_GROUPS:  # searching costs more than asking the row which are allowed
            present = closers.present(words) if present is None else present
            groups = groups[present[groups]]
        for group in groups.tolist():
            written = texts[group]
            text = content + written if written is not None else _extended(scan, raw + closers.contents[group])
            matched[group] = text is not None and search(text, start) is not None
    if matched.any():
        clear_unless_emptied(words, closers.ids[~matched[closers.group]])
    else:  # the usual case: every closer goes, in one pass over the row
        keep_unless_emptied(words, words & closers.kept)
    return scan


def _restrict_unread(raw: bytes, patterns: list[str], closers: Closers, words: np.ndarray) -> None:
    """``restrict_closing`` where the content so far ends in an open escape or a split character,
    which the closers' plain reading does not cover: each allowed token with a quote in it is read
    after the content as written, and cleared where it closes the string with no match. Rare (a
    step inside an escape), and few such tokens are allowed there (after a backslash, those that
    begin with an escape's letter)."""
    allowed = np.flatnonzero(token_bits(words, closers.quoted_ids))
    refused = []
    for index in allowed.tolist():
        text = raw + closers.quoted[index]
        at = closing_quote(text)
        if at is not None and not matches(text[:at], patterns):  # ``raw`` itself closes nothing
            refused.append(int(closers.quoted_ids[index]))
    clear_unless_emptied(words, refused)


def matches(raw: bytes, patterns: list[str]) -> bool:
    """Whether a whole string's content ``raw`` (as written) holds a match of one of ``patterns``
    (an unreadable content counts as one: the grammar judges it)."""
    content = decoded(raw)
    return content is None or any(_searcher(p).regex.search(content) for p in patterns)


def _extended(before: Scan | None, raw: bytes) -> str | None:
    """``raw`` decoded, reading only what it adds to ``before``'s content, which it extends (a
    content that decoded ends where an escape or a character does, so the rest decodes alone)."""
    if before is None:
        return decoded(raw)
    added = decoded(raw[len(before.raw) :])
    return None if added is None else before.content + added


def decoded(raw: bytes) -> str | None:
    """A string's content from its JSON text (``None`` where it is not whole: an open escape, a
    split character)."""
    if _PLAIN.fullmatch(raw):
        return raw.decode()  # the usual step: printable ASCII, no escapes (far faster than json)
    try:
        value = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None
