"""Where a loop sits in each kind of constrained output, and whether it counts there.

The repetition guard (``service/request/repetition.py``) finds cycles at the end of an output's tokens; a
cycle is a loop or not by where it lies, and the verdict names that place. Per kind of output:

- JSON (``response_format``): the ``inside`` rule holds for a stretch inside one string or number
  (or key); the ``bare`` rule for one inside any value (whole elements of an array repeating), the
  pointer then the innermost value that holds the whole stretch.
- Tool calls, in every format: the call still open is found with the format's own parser
  (``ToolFormat.split``), its arguments' JSON within it (the call's head for the formats written
  here, ``{"name": ..., "arguments": ``; for a registry's format, best effort, the first ``{``
  after the latest function name in the call's text), and the arguments are read as JSON above:
  the path is ``/<call index>/arguments<pointer>`` (the call's arguments key), as validation's
  errors point into calls, and the message names the call. Free text around the calls
  (``tool_choice: auto``) counts under the ``bare`` rule alone; an answer in a response format
  given with the tools is JSON.
- Structural tags: inside a tag whose content is JSON of a schema, JSON above, the path
  ``/<n>`` (the n-th such tag) as validation's; elsewhere the ``bare`` rule alone.
- EBNF, Lark, regex (custom tools' grammars among them): no value bounds a place, so the cycle alone
  counts, under the ``bare`` rule; the path is ``""``.
- A choice is a bounded list: never watched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenmold.grammar import Shape, ShapeKind
from tokenmold.grammar.json_pointer import pointer_to
from tokenmold.grammar.toolformats.base import call_prefix
from tokenmold.grammar.tools import ToolCalls
from tokenmold.service.request.repetition import CallRef, Locate, Loop, LoopSite, LoopWatch, RepetitionGuard
from tokenmold.service.validation.verdicts import schema_tag_spans

#: JSON characters that end a scalar value (outside strings).
_STRUCTURAL = frozenset("{}[],:")
#: Where a stretch lies when no value of the JSON holds it.
_OUTSIDE = "in the output"


def loop_watch(shape: Shape, guard: RepetitionGuard, decode: Callable[[list[int]], str]) -> LoopWatch | None:
    """The guard over the outputs of a request of ``shape``; ``None`` for a choice."""
    locate = _locator(shape)
    return LoopWatch(guard, decode, locate) if locate is not None else None


def _locator(shape: Shape) -> Locate | None:
    if shape.kind is ShapeKind.CHOICE:
        return None
    if shape.is_json:
        return json_site
    if shape.kind is ShapeKind.TOOLS:
        return _CallSites(shape.source).locate
    if shape.kind is ShapeKind.STRUCTURAL_TAG:
        return _TagSites(shape.source).locate
    return bare_site


def bare_site(text: str, start: int, loop: Loop) -> LoopSite | None:
    """Text that no value bounds (a grammar's output, free text): the ``bare`` rule alone."""
    return LoopSite("", _OUTSIDE, loop) if loop.rule.bare else None


def json_site(
    text: str, start: int, loop: Loop, *, under: str = "", outside: str = _OUTSIDE, call: CallRef | None = None
) -> LoopSite | None:
    """A loop in (partial) JSON ``text`` whose repeated stretch starts at ``start``: the value that
    holds it, if its rule counts there (module docstring). ``under``: the pointer of ``text`` in
    the output; ``outside``: what holds a stretch that no value does."""
    chain = open_values(text)
    if not loop.rule.bare:
        if not chain or chain[-1].kind in ("object", "array") or chain[-1].start > start:
            return None
        return LoopSite(under + chain[-1].pointer, f"inside this {chain[-1].kind}", loop, call)
    holding = [value for value in chain if value.start <= start]
    if not holding:
        return LoopSite(under, outside, loop, call)
    return LoopSite(under + holding[-1].pointer, f"in this {holding[-1].kind}", loop, call)


@dataclass(frozen=True)
class _CallSites:
    """Places a loop in tool-call output (module docstring)."""

    calls: ToolCalls

    def locate(self, text: str, start: int, loop: Loop) -> LoopSite | None:
        fmt = self.calls.tool_format
        split = fmt.split(text)
        if split.unclosed is None:
            if self.calls.answer is not None and not split.calls:
                return json_site(text, start, loop)
            return bare_site(text, start, loop)
        body_at = len(text) - len(split.unclosed)
        arguments = self._arguments(split.unclosed)
        call = CallRef(len(split.calls), arguments.name)
        at = body_at + arguments.at if arguments.at is not None else None
        if at is None or at > start:
            return LoopSite(f"/{call.index}", "in the text", loop, call) if loop.rule.bare else None
        under = f"/{call.index}" + pointer_to([fmt.arguments_key])
        return json_site(text[at:], start - at, loop, under=under, outside="in the arguments", call=call)

    def _arguments(self, body: str) -> _Arguments:
        """Where the arguments' JSON starts in an open call's text, and the function's name."""
        head = call_prefix(body)
        if head.name is not None:
            return _Arguments(head.arguments_at, head.name)
        name = max((tool.name for tool in self.calls.tools), key=lambda name: (body.rfind(name), len(name)))
        at = body.rfind(name)
        if at < 0:
            return _Arguments(None, None)
        brace = body.find("{", at + len(name))
        return _Arguments(brace if brace >= 0 else None, name)


@dataclass(frozen=True)
class _Arguments:
    """Where an open call's arguments start in its text (``None``: not found or not JSON)."""

    at: int | None
    name: str | None


@dataclass(frozen=True)
class _TagSites:
    """Places a loop in the output of a structural tag (module docstring)."""

    tag: dict[str, Any]

    def locate(self, text: str, start: int, loop: Loop) -> LoopSite | None:
        spans = schema_tag_spans(text, self.tag)
        open_at = [n for n, span in enumerate(spans) if not span.closed and span.body_at <= start]
        if not open_at:
            return bare_site(text, start, loop)
        span = spans[open_at[-1]]
        return json_site(span.body, start - span.body_at, loop, under=f"/{open_at[-1]}", outside="in this tag")


@dataclass(frozen=True)
class OpenValue:
    """A value a partial JSON text ends inside."""

    #: Where it starts in the text (its bracket, its opening quote, or its first character).
    start: int
    #: JSON Pointer of the value (for a key being written: its object's).
    pointer: str
    #: ``object``, ``array``, ``string``, ``number`` (also a literal) or ``key``.
    kind: str


@dataclass
class _Container:
    """An object or array open at the point a scan has reached."""

    start: int
    is_object: bool
    #: The member being written: its key (objects, ``None`` before the first) or index (arrays).
    key: str | int | None
    expecting_key: bool


def open_values(text: str) -> list[OpenValue]:
    """The values ``text`` (partial JSON) ends inside, outermost first: its open objects and
    arrays, then the string or number being written, if any. Best effort: a scan that tracks
    strings, escapes, nesting, keys and array indices (``[]`` when not JSON)."""
    stack: list[_Container] = []
    in_string = escape = string_is_key = False
    scalar_start: int | None = None
    key_chars: list[str] = []
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string, scalar_start = False, None
                if string_is_key and stack:
                    stack[-1].key, stack[-1].expecting_key = "".join(key_chars), False
            elif string_is_key:
                key_chars.append(ch)
            continue
        if ch == '"':
            in_string, scalar_start = True, i
            string_is_key = bool(stack) and stack[-1].is_object and stack[-1].expecting_key
            key_chars = []
        elif ch in _STRUCTURAL:
            scalar_start = None
            if ch in "{[":
                stack.append(_Container(i, ch == "{", None if ch == "{" else 0, ch == "{"))
            elif ch in "}]":
                if stack:
                    stack.pop()
            elif ch == "," and stack:
                top = stack[-1]
                if top.is_object:
                    top.expecting_key = True
                else:
                    top.key = int(top.key or 0) + 1
        elif ch.isspace():
            scalar_start = None
        elif scalar_start is None:
            scalar_start = i
    chain: list[OpenValue] = []
    keys: list[str | int] = []
    for container in stack:
        chain.append(OpenValue(container.start, pointer_to(keys), "object" if container.is_object else "array"))
        if container.key is not None:
            keys.append(container.key)
    if scalar_start is not None:
        if in_string and string_is_key:
            chain.append(OpenValue(scalar_start, chain[-1].pointer, "key"))
        else:
            chain.append(OpenValue(scalar_start, pointer_to(keys), "string" if in_string else "number"))
    return chain
