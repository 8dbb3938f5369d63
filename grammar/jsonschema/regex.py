r"""Regular expressions in schemas: how they are read, and as the grammar engine takes them.

JSON Schema's regex dialect (ECMA-262) has Unicode property escapes (``\p{Letter}``, ``\p{Lu}``)
that Python's ``re`` lacks: schema patterns are compiled and searched with the ``regex`` package
(``compile_pattern``, ``search``), here and in the validation layer. For the grammar, JSON Schema's
search is made a full match; lookbehind, backreferences, word boundaries, inline flags and ``{,n}``
are refused by the grammar engines (and lookahead mishandled): such a pattern is left to
validation, with the reason. Property escapes go to llguidance, which compiles JSON Schemas and
takes them; xgrammar, which compiles only the schemas llguidance refuses, does not (a 400 naming
the escape then).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

import regex


class PatternError(ValueError):
    """A schema's pattern is not a regular expression."""


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """``pattern`` compiled as a schema's regular expression (``PatternError`` if it is none)."""
    try:
        return _compiled(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        # regex raises a bare ValueError on a few malformed repeats ('{0s<'), found by fuzzing.
        raise PatternError(str(exc) or type(exc).__name__) from None


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text``, as JSON Schema's ``pattern`` asks."""
    return compile_pattern(pattern).search(text) is not None


@lru_cache(maxsize=1024)
def grammar_pattern(pattern: str) -> tuple[str | None, str]:
    """``(reason, pattern)`` if xgrammar's regex engine cannot take ``pattern``, else ``(None, regex)``.

    The engines refuse lookbehind, backreferences, word boundaries, inline flags and ``{,n}``, and
    mishandle lookahead. They also match a pattern against the whole string
    while JSON Schema searches for it anywhere, so unanchored ends get ``.*``. A ``^``/``$`` inside
    a group filling a whole alternative (``(^gs://(.+))|(^http://(.+))``) is hoisted out of it; one
    left inside a group leaves the pattern as written (no rewrite is faithful there). An anchored
    start whose end already takes any tail (``^gs://(.+)``) gets no ``.*``: the same language, but
    llguidance proves its slices inside ``.+`` and not inside ``.+.*`` (fast masks against slow ones
    on MaskBench's `o27402`; docs/design.md).
    """
    if "\x00" in pattern:
        return "NUL characters are not supported by the grammar engine", pattern
    alternatives, anchors_inside, reason = _scan(pattern)
    if reason is not None:
        return reason, pattern
    if anchors_inside:
        hoisted = "|".join(_hoist_anchors(alt) for alt in alternatives)
        if hoisted == pattern:
            return None, pattern
        alternatives, anchors_inside, _ = _scan(hoisted)
        if anchors_inside:
            return None, pattern
    parts = []
    for alt in alternatives:
        head = alt[1:] if alt.startswith("^") else ".*" + alt
        if _ends_with_anchor(head):
            parts.append(head[:-1])
        elif alt.startswith("^") and _ends_with_any(head):
            parts.append(head)
        else:
            parts.append(head + ".*")
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return None, "^" + body + "$"


def _significant(text: str) -> Iterator[tuple[int, str, bool]]:
    """The characters that give ``text`` its structure, with where they are: each backslash (and
    whether it is inside a class) and every character outside classes; what a backslash escapes
    and what a class holds are skipped."""
    i, in_class = 0, False
    while i < len(text):
        char = text[i]
        if char == "\\":
            yield i, char, in_class
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 2 if text.startswith("^", i + 1) else 1
            i += 1 if text.startswith("]", i) else 0  # a leading ']' is a literal
            continue
        else:
            yield i, char, False
        i += 1


def _scan(pattern: str) -> tuple[list[str], bool, str | None]:
    """Split ``pattern`` at top-level ``|``; report inner anchors and unsupported constructs."""
    alternatives: list[str] = []
    start, depth, inner_anchor = 0, 0, False
    for i, char, in_class in _significant(pattern):
        if char == "\\":
            reason = _unsupported_escape(pattern, i + 1, in_class)
            if reason is not None:
                return [], False, reason
        elif char == "(":
            reason = _unsupported_group(pattern, i)
            if reason is not None:
                return [], False, reason
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "{" and pattern.startswith(",", i + 1):
            return [], False, "'{,n}' repetition is not supported by the grammar engine"
        elif char == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
        elif (char == "^" and (depth > 0 or i != start)) or (
            char == "$" and (depth > 0 or not _at_alt_end(pattern, i))
        ):
            inner_anchor = True
    alternatives.append(pattern[start:])
    return alternatives, inner_anchor, None


def _unsupported_escape(pattern: str, i: int, in_class: bool) -> str | None:
    escaped = pattern[i : i + 1]
    if (escaped.isdigit() and escaped != "0" and not in_class) or pattern.startswith("k<", i):
        return "backreferences are not supported by the grammar engine"
    if escaped in ("b", "B") and not in_class:
        return "word boundaries are not supported by the grammar engine"
    return None


def _unsupported_group(pattern: str, i: int) -> str | None:
    for prefix, what in (("(?=", "lookahead"), ("(?!", "lookahead"), ("(?<=", "lookbehind"), ("(?<!", "lookbehind")):
        if pattern.startswith(prefix, i):
            return f"{what} is not supported by the grammar engine"
    if pattern.startswith("(?P=", i):
        return "backreferences are not supported by the grammar engine"
    if _INLINE_FLAGS.match(pattern, i):
        return "inline flags are not supported by the grammar engine"
    return None


_INLINE_FLAGS = re.compile(r"\(\?[a-zA-Z-]+[):]")


def _at_alt_end(pattern: str, i: int) -> bool:
    return i + 1 == len(pattern) or pattern[i + 1] == "|"


def _groups(text: str) -> dict[int, tuple[int, bool]]:
    """Each group of ``text`` by where it closes: where it opens, and whether a ``|`` of its own
    splits it."""
    groups: dict[int, tuple[int, bool]] = {}
    opened: list[list[int]] = []  # [where, split] per open group
    for i, char, _ in _significant(text):
        if char == "(":
            opened.append([i, 0])
        elif char == ")" and opened:
            where, split = opened.pop()
            groups[i] = (where, bool(split))
        elif char == "|" and opened:
            opened[-1][1] = 1
    return groups


def _ends_with_any(text: str) -> bool:
    """``text`` ends in an unescaped ``.*`` or ``.+``, bare or closing groups that no ``|`` splits
    (``gs://(.+)``): such a pattern already takes any rest of the line."""
    groups = _groups(text)
    end = len(text)
    while end and text[end - 1] == ")" and end - 1 in groups and not groups[end - 1][1]:
        end -= 1
    return text[end - 2 : end] in (".*", ".+") and not _escaped(text, end - 2)


def _hoist_anchors(alternative: str) -> str:
    """``(^X$)``, ``(^X)`` or ``(X$)`` filling a whole alternative, with no ``|`` of its own, as
    ``^(X)$``, ``^(X)``, ``(X)$``: the same language with the anchors where the grammar form needs
    them (``(^gs://(.+))|(^http://(.+))`` otherwise reaches llguidance as written)."""
    last = len(alternative) - 1
    whole = _groups(alternative).get(last)
    if whole is None or whole[0] != 0 or whole[1] or alternative.startswith("(?"):
        return alternative
    inner = alternative[1:last]
    head = "^" if inner.startswith("^") else ""
    tail = "$" if _ends_with_anchor(inner) and len(inner) > len(head) else ""
    return f"{head}({inner[len(head) : len(inner) - len(tail)]}){tail}"


def _ends_with_anchor(text: str) -> bool:
    """``text`` ends in an unescaped ``$``."""
    return text.endswith("$") and not _escaped(text, len(text) - 1)


def _escaped(text: str, at: int) -> bool:
    """Whether the character at ``at`` follows an odd run of backslashes."""
    before = text[:at]
    return (len(before) - len(before.rstrip("\\"))) % 2 == 1
