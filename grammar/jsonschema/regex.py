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
    while JSON Schema searches for it anywhere, so unanchored ends get ``.*`` (unchanged if ``^``/``$``
    appear inside groups, where no rewrite is faithful).
    """
    if "\x00" in pattern:
        return "NUL characters are not supported by the grammar engine", pattern
    alternatives, anchors_inside, reason = _scan(pattern)
    if reason is not None:
        return reason, pattern
    if anchors_inside:
        return None, pattern
    parts = []
    for alt in alternatives:
        head = alt[1:] if alt.startswith("^") else ".*" + alt
        parts.append(head[:-1] if _ends_with_anchor(head) else head + ".*")
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return None, "^" + body + "$"


def _scan(pattern: str) -> tuple[list[str], bool, str | None]:
    """Split ``pattern`` at top-level ``|``; report inner anchors and unsupported constructs."""
    alternatives: list[str] = []
    start, depth, i, in_class, inner_anchor = 0, 0, 0, False, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            reason = _unsupported_escape(pattern, i + 1, in_class)
            if reason is not None:
                return [], False, reason
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 2 if pattern.startswith("^", i + 1) else 1
            i += 1 if pattern.startswith("]", i) else 0  # a leading ']' is a literal
            continue
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
        i += 1
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


def _ends_with_anchor(text: str) -> bool:
    """``text`` ends in an unescaped ``$``."""
    if not text.endswith("$"):
        return False
    backslashes = len(text[:-1]) - len(text[:-1].rstrip("\\"))
    return backslashes % 2 == 0
