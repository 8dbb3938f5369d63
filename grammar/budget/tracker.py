"""Where a JSON output stands in its schema, and the shortest bytes that finish it from there.

The budget-fitting mask (``tokenmold.grammar.budget.fitter``) asks, for a state and for the state
after each candidate token, how many tokens the cheapest valid completion needs. This module
answers the first half: a byte-level JSON scanner over the normalized schema (the one the grammar
was built from) whose ``plan()`` is the shortest completion: an open escape or UTF-8 sequence
completed, the open string closed (after its ``minLength``, the shortest enum member it has
begun, or the shortest text its pattern or format still takes: ``tokenmold.grammar.budget.patterns``),
numbers ended, the required members still missing written at their shortest, arrays given
their ``minItems``, every bracket closed.

The tracker is immutable: ``feed`` returns a new one, so trying a token on it costs only the
frames that change (the mask tries dozens per step). Frames are small tuples; a frame's phase says
what the next byte may be. Anything it cannot follow (a byte the grammar should not have allowed,
an ``allOf`` left in the schema) makes it ``lost``: its plan is then ``None`` and the budget is left
to the grammar alone.

The plan is consistent in the sense the mask relies on: writing a prefix of the plan leads to a
state whose plan is the rest of it, so the first token of the plan's cheapest tokenization lowers
the cost by one, and a mask that keeps ``cost <= tokens left`` never runs out of tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache, partial
from typing import Any, NamedTuple, Protocol

from tokenmold.grammar.budget.numbers import finish_number
from tokenmold.grammar.budget.patterns import Unplannable, string_rule
from tokenmold.grammar.budget.schema import Candidate, FitSchema, Untracked, first_byte_kinds
from tokenmold.grammar.json_layout import COMPACT, JsonLayout
from tokenmold.grammar.json_pointer import pointer_token
from tokenmold.grammar.jsonschema.regex import search

_WHITESPACE = frozenset(b" \t\n\r")
_NUMBER = frozenset(b"0123456789+-.eE")
_ESCAPES = frozenset(b'"\\/bfnrt')
_HEX = frozenset(b"0123456789abcdefABCDEF")


class Text(NamedTuple):
    """A string being written: its bytes so far as written (JSON escapes kept) and its length."""

    raw: bytes = b""
    chars: int = 0
    #: 0: no escape open; -1: just after a backslash; k > 0: hex digits still due after ``\\u``.
    escape: int = 0
    #: Continuation bytes still due to complete a UTF-8 sequence (a token may end inside one).
    pending: int = 0

    def step(self, byte: int) -> Text | None:
        """The text after ``byte`` (not the closing quote); ``None`` for a byte JSON forbids here."""
        raw = self.raw + bytes([byte])
        if self.pending:
            return Text(raw, self.chars, 0, self.pending - 1) if byte & 0xC0 == 0x80 else None
        if self.escape == -1:
            if byte == ord("u"):
                return Text(raw, self.chars, 4)
            return Text(raw, self.chars + 1, 0) if byte in _ESCAPES else None
        if self.escape > 0:
            return Text(raw, self.chars + (self.escape == 1), self.escape - 1) if byte in _HEX else None
        if byte == ord("\\"):
            return Text(raw, self.chars, -1)
        if byte < 0x20 or byte & 0xC0 == 0x80:
            return None
        return Text(raw, self.chars + 1, 0, 3 if byte >= 0xF0 else 2 if byte >= 0xE0 else 1 if byte >= 0xC0 else 0)

    @property
    def open(self) -> bool:
        """Inside an escape or a UTF-8 sequence: the string cannot close yet."""
        return bool(self.escape or self.pending)

    @property
    def rest(self) -> bytes:
        """The shortest bytes that complete an open escape or UTF-8 sequence."""
        if self.pending:
            # The smallest valid continuation: after E0 and F0 the second byte has a higher floor.
            last = self.raw[-1]
            second = {0xE0: 0xA0, 0xF0: 0x90}.get(last, 0x80) if last >= 0xC0 else 0x80
            return bytes([second]) + b"\x80" * (self.pending - 1)
        return b"n" if self.escape == -1 else b"0" * self.escape


class Str(NamedTuple):
    pointer: str
    cands: tuple[Candidate, ...]
    text: Text = Text()


class Num(NamedTuple):
    pointer: str
    text: str
    cands: tuple[Candidate, ...] = ()


class Lit(NamedTuple):
    pointer: str
    rest: str


class Obj(NamedTuple):
    pointer: str
    cands: tuple[Candidate, ...]
    keys: tuple[str, ...] = ()
    #: open (after ``{``), key (after ``,``), in_key, colon, value, after (a member written).
    phase: str = "open"
    key: Text = Text()
    #: The grammar's separators here, and the rest of the one just begun still to write.
    layout: JsonLayout = COMPACT
    owed: str = ""


class Arr(NamedTuple):
    pointer: str
    cands: tuple[Candidate, ...]
    items: int = 0
    #: open (after ``[``), item (after ``,``), after (an item written).
    phase: str = "open"
    layout: JsonLayout = COMPACT
    owed: str = ""


class Root(NamedTuple):
    """A whole JSON value: the output's, or the arguments of a call of tool ``tool`` (at ``pointer``)."""

    cands: tuple[Candidate, ...]
    done: bool = False
    tool: int = -1
    pointer: str = ""


#: What follows a ``Lead`` option: tool ``i``'s arguments (``i >= 0``), the text after a call, the
#: end of the output, or (an empty option) a JSON answer instead of calls.
CALL_END, OUTPUT_END, ANSWER = -1, -2, -3


class Lead(NamedTuple):
    """Literal text around tool calls: the options still open (their text and what follows them),
    the bytes written of it, and the calls completed before it."""

    options: tuple[tuple[bytes, int], ...]
    written: bytes = b""
    calls: int = 0


class Free(NamedTuple):
    """Free text around tool calls (``tool_choice: auto``): it may end anywhere; a call begins where
    it ends with the layout's trigger. ``tail``: its longest end that begins the trigger."""

    tail: bytes = b""
    calls: int = 0


Value = Str | Num | Lit | Obj | Arr
Frame = Value | Root | Lead | Free


class TokenClasses(Protocol):
    """Per token id of a vocabulary: its bytes, whether it ``is_content``, and then its characters
    (the budget fitter's and the bound guard's tables)."""

    by_id: list[bytes]
    content: Any
    chars: Any


class Tracker:
    """One output's position in its schema (immutable; see the module docstring)."""

    __slots__ = ("schema", "stack", "lost")

    def __init__(self, schema: FitSchema, stack: tuple[Frame, ...] | None = None, lost: bool = False) -> None:
        self.schema = schema
        if stack is None:
            calls = schema.calls
            if calls is not None and calls.trigger:
                stack = (Free(),)
            elif calls is not None:
                answer = ((b"", ANSWER),) if calls.answer else ()
                stack = (Lead(tuple((calls.section_begin + b, i) for i, b in enumerate(calls.begins)) + answer),)
            else:
                try:
                    stack = (Root(schema.candidates(schema.root)),)
                except Untracked:
                    stack, lost = (Root(()),), True
        self.stack: tuple[Frame, ...] = stack
        self.lost = lost

    @property
    def top(self) -> Frame:
        return self.stack[-1]

    @property
    def done(self) -> bool:
        """Whether the output may end here."""
        top = self.stack[-1]
        if isinstance(top, Free):
            return True
        if isinstance(top, Lead):
            return any(code == OUTPUT_END and text == top.written for text, code in top.options)
        return isinstance(top, Root) and top.done

    def feed(self, data: bytes) -> Tracker:
        """The tracker after ``data``."""
        if self.lost:
            return self
        stack: tuple[Frame, ...] | None = self.stack
        try:
            for byte in data:
                assert stack is not None
                stack = self._step(stack, byte)
                if stack is None:
                    break
        except (Untracked, ValueError):  # ValueError: a key that is not valid JSON text
            stack = None
        return Tracker(self.schema, stack) if stack is not None else Tracker(self.schema, self.stack, True)

    def extend(self, data: bytes, chars: int) -> Tracker:
        """The tracker after ``data``, a token of ``chars`` whole characters that ``is_content``:
        inside a string (the common step) it is appended without scanning its bytes."""
        top = self.stack[-1]
        if self.lost or not isinstance(top, Str) or top.text.open:
            return self.feed(data)
        text = Text(top.text.raw + data, top.text.chars + chars)
        return Tracker(self.schema, self.stack[:-1] + (top._replace(text=text),))

    def after_token(self, table: TokenClasses, token: int) -> Tracker:
        """The tracker after token ``token`` of ``table``'s vocabulary (``extend`` for content)."""
        if table.content[token]:
            return self.extend(table.by_id[token], int(table.chars[token]))
        return self.feed(table.by_id[token])

    def open_values(self) -> list[Value]:
        """The values being written, outermost first."""
        return [frame for frame in self.stack if not isinstance(frame, (Root, Lead, Free))]

    # --- scanning ---------------------------------------------------------------------------------

    def _step(self, stack: tuple[Frame, ...], byte: int) -> tuple[Frame, ...] | None:
        top, below = stack[-1], stack[:-1]
        if isinstance(top, Str):
            if byte == ord('"') and not top.text.open:
                return self._close(below)
            text = top.text.step(byte)
            return None if text is None else below + (top._replace(text=text),)
        if isinstance(top, Num):
            if byte in _NUMBER:
                return below + (top._replace(text=top.text + chr(byte)),)
            closed = self._close(below)
            return None if closed is None else self._step(closed, byte)
        if isinstance(top, Lit):
            if not top.rest or byte != ord(top.rest[0]):
                return None
            return self._close(below) if len(top.rest) == 1 else below + (top._replace(rest=top.rest[1:]),)
        if isinstance(top, Obj):
            return self._object(top, below, byte)
        if isinstance(top, Arr):
            return self._array(top, below, byte)
        if isinstance(top, Lead):
            return self._lead(top, below, byte)
        if isinstance(top, Free):
            return self._free(top, below, byte)
        if byte in _WHITESPACE:
            return stack
        layout = self.schema.layout_of(top.tool)
        return None if top.done else self._start(stack, top.cands, top.pointer, byte, layout)

    def _lead(self, top: Lead, below: tuple[Frame, ...], byte: int) -> tuple[Frame, ...] | None:
        """Literal text around calls; once one option is written whole (and no longer one shares
        it), what follows it begins."""
        calls = self.schema.calls
        assert calls is not None
        written = top.written + bytes([byte])
        options = tuple(o for o in top.options if o[1] != ANSWER and o[0].startswith(written))
        complete = [code for text, code in options if text == written]
        if not options:
            if top.written or all(code != ANSWER for _, code in top.options):
                return None
            answer = len(calls.begins)  # no call begins so: the JSON answer does
            root = Root(self.schema.candidates(self.schema.root["tools"][answer]), False, answer)
            return self._step(below + (root,), byte)
        if not complete or len(complete) < len(options):
            return below + (top._replace(options=options, written=written),)
        code = complete[0]
        if code == OUTPUT_END:
            return below + (Root((), True),)
        if code == CALL_END:
            if calls.trigger and calls.parallel:
                return below + (Free(b"", top.calls + 1),)
            after = tuple((calls.separator + b, i) for i, b in enumerate(calls.begins)) if calls.parallel else ()
            return below + (Lead(after + ((calls.section_end, OUTPUT_END),), b"", top.calls + 1),)
        arguments = self.schema.root["tools"][code]
        tail = Lead(((calls.end, CALL_END),), b"", top.calls)
        root = Root(self.schema.candidates(arguments), False, code, f"/{top.calls}/arguments")
        return below + (tail, root)

    def _free(self, top: Free, below: tuple[Frame, ...], byte: int) -> tuple[Frame, ...]:
        """Free text; once it ends with the trigger, the rest of a call's begin follows."""
        calls = self.schema.calls
        assert calls is not None
        tail = top.tail + bytes([byte])
        while tail and not calls.trigger.startswith(tail):
            tail = tail[1:]
        if tail != calls.trigger:
            return below + (top._replace(tail=tail),)
        rests = tuple((begin[len(tail) :], i) for i, begin in enumerate(calls.begins))
        return below + (Lead(rests, b"", top.calls),)

    def _object(self, top: Obj, below: tuple[Frame, ...], byte: int) -> tuple[Frame, ...] | None:
        phase = top.phase
        if phase == "in_key":
            if byte == ord('"') and not top.key.open:
                name = json.loads(b'"' + top.key.raw + b'"')
                cands = tuple(c for c in top.cands if _member_schema(c, name) is not _ABSENT)
                if not cands or name in top.keys:
                    return None
                return below + (top._replace(cands=cands, keys=top.keys + (name,), phase="colon", key=Text()),)
            key = top.key.step(byte)
            return None if key is None else below + (top._replace(key=key),)
        if byte in _WHITESPACE:
            return below + (_paid(top, byte),)
        if phase in ("open", "key") and byte == ord('"'):
            return below + (top._replace(phase="in_key", key=Text(), owed=""),)
        if phase in ("open", "after") and byte == ord("}"):
            return self._close(below)
        if phase == "after" and byte == ord(","):
            return below + (top._replace(phase="key", owed=top.layout.item[1:]),)
        if phase == "colon" and byte == ord(":"):
            return below + (top._replace(phase="value", owed=top.layout.key[1:]),)
        if phase == "value":
            name = top.keys[-1]
            cands = tuple(c for s in (_member_schema(c, name) for c in top.cands) for c in self.schema.candidates(s))
            return self._start(below + (top,), cands, f"{top.pointer}/{pointer_token(name)}", byte, top.layout)
        return None

    def _array(self, top: Arr, below: tuple[Frame, ...], byte: int) -> tuple[Frame, ...] | None:
        if byte in _WHITESPACE:
            return below + (_paid(top, byte),)
        if top.phase in ("open", "after") and byte == ord("]"):
            return self._close(below)
        if top.phase == "after":
            return below + (top._replace(phase="item", owed=top.layout.item[1:]),) if byte == ord(",") else None
        cands = tuple(c for a in top.cands for c in self.schema.candidates(_item_schema(a, top.items)))
        return self._start(below + (top,), cands, f"{top.pointer}/{top.items}", byte, top.layout)

    def _start(
        self, stack: tuple[Frame, ...], cands: tuple[Candidate, ...], pointer: str, byte: int, layout: JsonLayout
    ) -> tuple[Frame, ...] | None:
        """``stack`` with a value begun by ``byte``, read as the candidates its first byte allows
        (an object or array laid out in ``layout``)."""
        kinds = first_byte_kinds(byte)
        fitting = tuple(c for c in cands if c.kind in kinds)
        if not fitting:
            return None
        kind = kinds[0]
        if kind == "string":
            return stack + (Str(pointer, fitting),)
        if kind == "object":
            return stack + (Obj(pointer, fitting, layout=layout),)
        if kind == "array":
            return stack + (Arr(pointer, fitting, layout=layout),)
        if kind == "number":
            return stack + (Num(pointer, chr(byte), fitting),)
        return stack + (Lit(pointer, {"t": "rue", "f": "alse", "n": "ull"}[chr(byte)]),)

    def _close(self, below: tuple[Frame, ...]) -> tuple[Frame, ...] | None:
        """The stack once the value on top of ``below`` is complete."""
        parent = below[-1]
        if isinstance(parent, Obj):
            return below[:-1] + (parent._replace(phase="after", owed=""),)
        if isinstance(parent, Arr):
            return below[:-1] + (parent._replace(items=parent.items + 1, phase="after", owed=""),)
        if isinstance(parent, Root):
            # A call's arguments: the text after them comes next.
            return below[:-1] if len(below) > 1 else below[:-1] + (parent._replace(done=True),)
        return None

    # --- planning ---------------------------------------------------------------------------------

    def plan(self) -> bytes | None:
        """The shortest bytes that complete the output from here (``None`` when lost or stuck)."""
        if self.lost:
            return None
        parts = []
        for depth in range(len(self.stack) - 1, -1, -1):
            part = self._finish(self.stack[depth], top=depth == len(self.stack) - 1)
            if part is None:
                return None
            parts.append(part)
        return b"".join(parts)

    def _finish(self, frame: Frame, *, top: bool) -> bytes | None:
        if isinstance(frame, Str):
            return _finish_string(frame)
        if isinstance(frame, Num):
            return finish_number(frame.text, frame.cands)
        if isinstance(frame, Lit):
            return frame.rest.encode()
        if isinstance(frame, Obj):
            frame = frame if top else frame._replace(phase="after")
            return _cheapest(self._finish_object(frame, c) for c in frame.cands)
        if isinstance(frame, Arr):
            if not top and frame.phase != "after":
                frame = frame._replace(items=frame.items + 1, phase="after")
            return _cheapest(self._finish_array(frame, c) for c in frame.cands)
        if isinstance(frame, Lead):
            return _cheapest(text[len(frame.written) :] + self._after(code) for text, code in frame.options)
        if isinstance(frame, Free):
            return b""
        if frame.done or not top:
            return b""
        schema = self.schema.root["tools"][frame.tool] if frame.tool >= 0 else self.schema.root
        return self.schema.floor(schema, self.schema.layout_of(frame.tool)).encode()

    def _after(self, code: int) -> bytes:
        """The shortest text after a ``Lead`` option: the arguments and the end of a call, then the
        section's end (the shortest way out after any call)."""
        calls = self.schema.calls
        if code == OUTPUT_END or calls is None:
            return b""
        if code == CALL_END:
            return calls.section_end
        code = len(calls.begins) if code == ANSWER else code
        floor = self.schema.floor(self.schema.root["tools"][code], self.schema.layout_of(code)).encode()
        return floor if code == len(calls.begins) else floor + calls.end + calls.section_end

    def _finish_object(self, frame: Obj, cand: Candidate) -> bytes | None:
        layout = frame.layout
        item, colon, floor = layout.item, layout.key.encode(), partial(self.schema.floor, layout=layout)
        keys = frame.keys
        missing = _missing(cand, keys)

        def members(names: list[str], lead: bool) -> bytes:
            return "".join(
                (item if lead or i else "") + _json(n) + layout.key + floor(_member_schema(cand, n))
                for i, n in enumerate(names)
            ).encode()

        phase, owed = frame.phase, frame.owed.encode()
        if phase in ("open", "after"):
            return members(missing, phase == "after") + b"}"
        if phase in ("colon", "value"):
            value = floor(_member_schema(cand, keys[-1])).encode()
            return (colon if phase == "colon" else owed) + value + members(missing, True) + b"}"
        if phase == "key":
            if missing:
                return owed + members(missing, False) + b"}"
            return _cheapest(owed + (_json(n) + layout.key + floor(s) + "}").encode() for n, s in _optional(cand, keys))
        # in_key: finish the key the cheapest way, then its value and the required rest.
        key = frame.key
        options = []
        for name, schema in _named(cand, keys):
            written = _json(name)[1:-1].encode()
            if written.startswith(key.raw) and not _skips(cand, missing, name):
                rest = [n for n in missing if n != name]
                tail = written[len(key.raw) :]
                options.append(tail + b'"' + colon + floor(schema).encode() + members(rest, True) + b"}")
        extra = cand.schema.get("additionalProperties", True)
        if extra is not False and not missing:  # extra keys come after the listed ones
            closed = key.raw + key.rest
            name = json.loads(b'"' + closed + b'"')
            if name not in keys and name not in cand.schema.get("properties", {}):
                options.append(key.rest + b'"' + colon + floor(extra).encode() + members(missing, True) + b"}")
        return _cheapest(options)

    def _finish_array(self, frame: Arr, cand: Candidate) -> bytes | None:
        low, sep, owed = int(cand.schema.get("minItems", 0)), frame.layout.item, ""
        if frame.phase == "open":
            need, lead = low, False
        elif frame.phase == "item":
            need, lead, owed = max(1, low - frame.items), False, frame.owed
        else:
            need, lead = max(0, low - frame.items), True
        items = []
        for i in range(frame.items, frame.items + need):
            schema = _item_schema(cand, i)
            if schema is False:
                return None
            items.append(self.schema.floor(schema, frame.layout))
        return (owed + (sep if lead and items else "") + sep.join(items) + "]").encode()


#: A member the candidate cannot hold.
_ABSENT = object()


def _member_schema(cand: Candidate, name: str) -> object:
    properties = cand.schema.get("properties", {})
    if name in properties:
        return properties[name]
    for pattern, schema in cand.schema.get("patternProperties", {}).items():
        try:
            if search(pattern, name):
                return schema
        except Exception as exc:  # a pattern the tracker's regex engine cannot read
            raise Untracked(f"patternProperties {pattern!r}") from exc
    extra = cand.schema.get("additionalProperties", True)
    return _ABSENT if extra is False else extra


def _item_schema(cand: Candidate, index: int) -> object:
    prefix = cand.schema.get("prefixItems", [])
    return prefix[index] if index < len(prefix) else cand.schema.get("items", True)


def _missing(cand: Candidate, keys: tuple[str, ...]) -> list[str]:
    """Required names not written yet, in the order the grammar writes properties."""
    order = list(cand.schema.get("properties", {}))
    missing = [n for n in cand.schema.get("required", []) if n not in keys]
    return sorted(missing, key=lambda n: order.index(n) if n in order else len(order))


def _named(cand: Candidate, keys: tuple[str, ...]) -> list[tuple[str, object]]:
    """The listed members that may still come: the grammar writes them in their listed order (a
    member before the last one written is closed), and none once an extra key was written."""
    properties = cand.schema.get("properties", {})
    order = list(properties)
    written = [order.index(k) for k in keys if k in properties]
    if len(written) < len(keys):
        return []
    after = max(written, default=-1)
    return [(n, properties[n]) for n in order[after + 1 :]]


def _skips(cand: Candidate, missing: list[str], name: str) -> bool:
    """Whether writing listed ``name`` next would skip a required member listed before it."""
    order = list(cand.schema.get("properties", {}))
    return any(n in order and order.index(n) < order.index(name) for n in missing)


def _optional(cand: Candidate, keys: tuple[str, ...]) -> list[tuple[str, object]]:
    """Members that may come next when none is required: a listed one, else an extra key."""
    listed = _named(cand, keys)
    extra = cand.schema.get("additionalProperties", True)
    return listed + ([("", extra)] if extra is not False and "" not in keys else [])


def _paid(frame: Obj | Arr, byte: int) -> Obj | Arr:
    """``frame`` after whitespace ``byte``: a byte of the separator still owed is paid (other
    whitespace the grammar of a fixed layout never lets through)."""
    if frame.owed[:1] == chr(byte):
        return frame._replace(owed=frame.owed[1:])
    return frame


def _finish_string(frame: Str) -> bytes | None:
    text = frame.text
    options: list[bytes | None] = []
    for cand in frame.cands:
        values = cand.values
        try:
            rule = string_rule(cand.schema) if values is None else None
        except Unplannable:  # refused for fitting up front; never planned as filler
            options.append(None)
            continue
        if rule is not None:
            tail = rule.finish(text.raw, text.chars, text.escape, text.pending)
            options.append(None if tail is None else tail + b'"')
            continue
        if values is None:
            need = max(0, int(cand.schema.get("minLength", 0)) - text.chars - (text.escape != 0))
            options.append(text.rest + b"a" * need + b'"')
            continue
        for value in values:
            written = _json(value)[1:-1].encode()
            if written.startswith(text.raw):
                options.append(written[len(text.raw) :] + b'"')
    return _cheapest(options)


def _cheapest(options: Iterable[bytes | None]) -> bytes | None:
    found = [o for o in options if o is not None]
    return min(found, key=len) if found else None


@lru_cache(maxsize=4096)
def _json(value: str) -> str:
    """A property name or enum string as JSON writes it (plans repeat the same few names)."""
    return json.dumps(value, ensure_ascii=False)


def is_content(data: bytes) -> bool:
    """Whole characters that can only extend a string: no quote, backslash or control byte, and no
    UTF-8 sequence begun or ended outside the token (those change what closing the string needs)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any(b in b'"\\' or b < 0x20 for b in data)
