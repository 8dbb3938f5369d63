"""One interface for a tool-call format: how a model family writes its calls.

A model calls tools in the syntax its chat template taught it (Hermes/Qwen ``<tool_call>`` tags,
Llama 3.x bare JSON, Mistral's ``[TOOL_CALLS]`` list). A format holds that syntax once, so that the
grammar that constrains the model and the parsers that read its output can never disagree:

- ``detects(template)``: whether a chat template teaches this syntax (the format is chosen once, when
  the model loads);
- ``syntax``: the grammar of the calls (``CallSyntax``: a trigger, each call's begin and end around
  its arguments, a separator, an optional section around all calls), which each backend's
  ``compile_tools`` turns into its own grammar;
- ``render_calls`` / ``describe``: earlier calls and the instruction example, for prompts whose
  template cannot render tools itself;
- ``split``: the complete-text parser (free text, each call's JSON, a call that never closed);
- ``stream``: the incremental parser (``ToolCallStream``) that releases free text and argument
  fragments as the text grows.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenmold.grammar.tools import Tool

from tokenmold.grammar.json_layout import ARGUMENTS

#: Stands for the function's name in ``CallSyntax.call_begin``.
NAME = "{name}"


@dataclass(frozen=True)
class CallSyntax:
    """The exact text of calls, as the grammar generates them.

    One call is ``call_begin`` (with the function name for ``{name}``), the arguments object, then
    ``call_end``; several follow each other with ``separator``; ``section_begin``/``section_end``
    (when given) wrap all the calls of one answer. ``trigger`` is the text that starts the calls
    inside free text (``tool_choice: auto``): a prefix of the section's or of every call's begin.
    """

    trigger: str
    call_begin: str
    call_end: str
    separator: str
    section_begin: str = ""
    section_end: str = ""

    def begin(self, name: str) -> str:
        return self.call_begin.replace(NAME, name)


@dataclass(frozen=True)
class SplitText:
    """Generated text split into the free text around calls (as generated, not stripped) and each
    call's JSON object text. ``unclosed`` is the text of a call (or call list) that never closed."""

    content: str
    calls: list[str]
    unclosed: str | None = None


@dataclass(frozen=True)
class ParsedCall:
    """One call: the function's name and its arguments object as JSON text, as written."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolFormat:
    """A tool-call format (subclasses: one per model family; instances are stateless values)."""

    #: The name ``--tool-call-format`` takes.
    name: str = ""
    syntax: CallSyntax = field(default_factory=lambda: CallSyntax("", "", "", ""))
    #: The key of the arguments object in a call's JSON.
    arguments_key: str = "arguments"
    #: Texts that may start a call within free text (held back while streaming until decided).
    triggers: tuple[str, ...] = ()
    #: The syntax includes a control token (special in the family's vocabulary), which the
    #: detokenizer must keep in the text for the parser to see it.
    control_tokens: bool = False

    def detects(self, template: str) -> bool:
        """Whether ``template`` (a chat template's text) teaches this format."""
        raise NotImplementedError

    def bind(self, tools: Sequence[Tool]) -> ToolFormat:
        """This format for a request's ``tools`` (a parser that reads argument values by their
        schema needs them); the formats written here read calls alike for any tools."""
        return self

    def split(self, text: str) -> SplitText:
        """The complete-text parser; also reads a text that is still growing (the last call is then
        ``unclosed``)."""
        raise NotImplementedError

    def call_schema(self, name: str) -> dict[str, Any]:
        """The JSON Schema of one call's JSON object, in this format's keys, arguments unchecked:
        they are validated against the function's parameters as a document of their own, because
        a ``$ref`` in them (``#/$defs/...``, as pydantic writes every nested model and enum) points
        at the parameters' root, which would not be the root here."""
        return {
            "type": "object",
            "properties": {"name": {"const": name}, self.arguments_key: True},
            "required": ["name", self.arguments_key],
            "additionalProperties": False,
        }

    def render_calls(self, calls: list[tuple[str, Any]]) -> str:
        """``(name, arguments)`` calls written exactly as the grammar generates them."""
        s = self.syntax
        written = [f"{s.begin(name)}{ARGUMENTS.dumps(arguments)}{s.call_end}" for name, arguments in calls]
        return f"{s.section_begin}{s.separator.join(written)}{s.section_end}"

    def describe(self) -> str:
        """How to write one call, for an instruction: the syntax with placeholders."""
        s = self.syntax
        begin = s.call_begin.replace(f'"{NAME}"', "<function name>")
        return f"{s.section_begin}{begin}<arguments as a JSON object>{s.call_end}{s.section_end}"

    def new_call_id(self) -> str:
        """An id for a generated call (OpenAI's ``call_`` form unless the family needs its own)."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def replay_id(self, call_id: str) -> str:
        """A client's call id as the chat template accepts it (unchanged unless the family's
        template checks ids)."""
        return call_id

    def read_call(self, body: str) -> ParsedCall | None:
        """One call's JSON object text to a call; ``None`` if it is not one."""
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        key = self.arguments_key if self.arguments_key in value else "arguments"
        if key not in value:
            return None
        written = call_prefix(body)
        if written.name == value["name"] and written.closed and _same_json(written.arguments, value[key]):
            return ParsedCall(value["name"], written.arguments)  # the arguments exactly as streamed
        return ParsedCall(value["name"], json.dumps(value[key], ensure_ascii=False))

    def stream(self, *, hold_repeats: bool = False, answered: Sequence[ParsedCall] = ()) -> ToolCallStream:
        """The incremental parser; ``hold_repeats``: a call that could still repeat an earlier one
        of the answer, or one of the ``answered`` calls of the conversation, is held back (the
        repeated-call guard drops a repeat)."""
        return ToolCallStream(self, hold_repeats=hold_repeats, answered=tuple(answered))


def same_call(a: ParsedCall, b: ParsedCall) -> bool:
    """The same function with the same arguments, compared as parsed JSON (key order and spacing
    aside) with strings compared loosely (``_loose``): a model caught in a loop writes ``"oslo"``
    after ``"Oslo"``, and it is the same question."""
    if a.name != b.name:
        return False
    first, second = _loads(a.arguments), _loads(b.arguments)
    return first is not _NOT_JSON and second is not _NOT_JSON and _loose(first) == _loose(second)


def first_repeat(calls: list[ParsedCall | None], answered: Sequence[ParsedCall] = ()) -> int | None:
    """The index of the first call identical (``same_call``) to an earlier one, or to one of the
    ``answered`` calls (calls the conversation already made and got an answer for), if any."""
    for index, call in enumerate(calls):
        if call is None:
            continue
        before = [*answered, *(earlier for earlier in calls[:index] if earlier is not None)]
        if any(same_call(earlier, call) for earlier in before):
            return index
    return None


#: What ``_loose`` strips from both ends of a string: spacing and sentence punctuation (not ``+``
#: or ``#``, which make ``C++`` and ``C#`` other values than ``C``).
_LOOSE_ENDS = " .,;:!?'\""


def _loose(value: Any) -> Any:
    """A JSON value as calls are compared: each string case-folded, its runs of whitespace one
    space, spacing and sentence punctuation at its ends dropped (``"Oslo"``, ``" oslo."`` and
    ``"OSLO"`` are one value; ``"Oslo, Norway"`` is another: a qualified value can be another
    question). Keys, numbers and literals compare exactly."""
    if isinstance(value, str):
        return " ".join(value.casefold().split()).strip(_LOOSE_ENDS)
    if isinstance(value, list):
        return [_loose(item) for item in value]
    if isinstance(value, dict):
        return {key: _loose(item) for key, item in value.items()}
    return value


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _NOT_JSON


#: Stands for arguments that do not parse (equal to nothing).
_NOT_JSON = object()


# ---------------------------------------------------------------- reading a call as it grows


@dataclass(frozen=True)
class CallPrefix:
    """What the text of a call that is still being written says so far: the name once it is
    complete, the arguments text written so far (never beyond the arguments' own end)."""

    name: str | None
    arguments: str = ""
    #: The arguments value has ended.
    closed: bool = False
    #: Where the arguments start in the call's text (the repetition guard reads them there).
    arguments_at: int = 0


#: A call object's head in the grammar's layout: the name first, then the arguments key.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def call_prefix(body: str, scanner: ValueScanner | None = None) -> CallPrefix:
    """Read a (possibly partial) call object ``{"name": ..., "arguments": ...}``. ``scanner`` (one
    per call, while its text grows by appending) saves re-reading the arguments already read."""
    head = _HEAD.match(body)
    if head is None:
        return CallPrefix(None)
    name = json.loads(head.group(1))
    arguments = body[head.end() :]
    end = (scanner or ValueScanner()).scan(arguments)
    return CallPrefix(name, arguments[:end] if end is not None else arguments, end is not None, head.end())


@dataclass
class ValueScanner:
    """Finds where a JSON value ends in a text that grows by appending, reading each character once
    (only nesting and strings are tracked: the grammar has already made the value valid)."""

    read: int = 0
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    end: int | None = None

    def scan(self, text: str) -> int | None:
        """The index just past the value that starts at ``text[0]``; ``None`` while it has not ended."""
        for i in range(self.read, len(text)):
            if self.end is not None:
                break
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.end = i + 1
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.end = i + 1 if self.depth == 0 else i
            elif self.depth == 0 and c in ", \t\r\n" and i > 0:
                self.end = i  # the end of a number or literal
        self.read = max(self.read, len(text))
        return self.end


def _same_json(text: str, value: Any) -> bool:
    if value is _NOT_JSON:
        return False
    try:
        return bool(json.loads(text) == value)
    except json.JSONDecodeError:
        return False


def partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    for marker in markers:
        for size in range(min(len(text), len(marker) - 1), best, -1):
            if marker.startswith(text[-size:]):
                best = size
                break
    return best


# ---------------------------------------------------------------- streaming


@dataclass(frozen=True)
class CallDelta:
    """A piece of call ``index``: its name in the first piece, then argument fragments."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class StreamPiece:
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


@dataclass
class ToolCallStream:
    """Incremental ``split``: feed text deltas, get free text and call pieces.

    Free text is released as it comes, except a tail that could still begin a call (a prefix of a
    trigger) and surrounding whitespace (the complete answer's content is stripped); a call opens
    (index and name) as soon as its name is complete, then its arguments follow fragment by
    fragment. ``finish`` reconciles with the complete answer, so that the pieces always add up to
    it. Each feed re-splits the text so far (the format's one parser, at C speed: string search and
    the JSON decoder); an open call's arguments are scanned only where they grew.
    """

    format: ToolFormat
    #: Hold back a call while it could still repeat an earlier one (released once it diverges).
    hold_repeats: bool = False
    #: Calls the conversation already made and got answers for: held back like earlier calls.
    answered: tuple[ParsedCall, ...] = ()
    text: str = ""
    content_sent: str = ""
    #: Per opened call: (name, arguments sent so far).
    calls_sent: list[tuple[str, str]] = field(default_factory=list)
    _scanners: dict[int, ValueScanner] = field(default_factory=dict)

    def feed(self, delta: str) -> StreamPiece:
        self.text += delta
        split = self.format.split(self.text)
        content = split.content
        if split.unclosed is None:
            hold = partial_suffix(self.text, self.format.triggers)
            if hold and content.endswith(self.text[-hold:]):
                content = content[:-hold]
        bodies = split.calls + ([split.unclosed] if split.unclosed else [])
        return StreamPiece(self._content(content.strip()), self._calls(bodies))

    def finish(self, content: str | None, calls: list[ParsedCall] | None) -> StreamPiece:
        """What is left once the answer is known: ``content``/``calls`` are the complete answer's
        (``calls`` ``None`` when the answer holds no valid calls: then only text not yet sent
        before any call follows, since sent call pieces cannot be taken back)."""
        text = self._content(content or "") if calls is not None or not self.calls_sent else ""
        pieces = []
        for index, call in enumerate(calls or []):
            if index >= len(self.calls_sent):
                self.calls_sent.append((call.name, call.arguments))
                pieces.append(CallDelta(index, call.name, call.arguments))
                continue
            _, sent = self.calls_sent[index]
            if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                pieces.append(CallDelta(index, arguments=call.arguments[len(sent) :]))
                self.calls_sent[index] = (call.name, call.arguments)
        return StreamPiece(text, pieces)

    def _content(self, visible: str) -> str:
        if not visible.startswith(self.content_sent):
            return ""  # never contradict what was sent; finish() settles the rest
        new, self.content_sent = visible[len(self.content_sent) :], visible
        return new

    def _calls(self, bodies: list[str]) -> list[CallDelta]:
        pieces = []
        earlier = list(self.answered)
        for index, body in enumerate(bodies):
            prefix = call_prefix(body, self._scanners.setdefault(index, ValueScanner()))
            if prefix.name is None:
                break  # later calls wait for this one's name (indices stay in order)
            if self.hold_repeats and index == len(self.calls_sent) and _may_repeat(prefix, earlier):
                break  # held back, and the calls after it, while it could repeat an earlier call
            earlier.append(ParsedCall(prefix.name, prefix.arguments))
            if index == len(self.calls_sent):
                # One entry per call and chunk, its name and first arguments together: the openai
                # SDK's stream helper appends a second entry of the same index as another call.
                self.calls_sent.append((prefix.name, prefix.arguments))
                pieces.append(CallDelta(index, prefix.name, prefix.arguments))
                continue
            name, sent = self.calls_sent[index]
            if prefix.arguments.startswith(sent) and len(prefix.arguments) > len(sent):
                pieces.append(CallDelta(index, arguments=prefix.arguments[len(sent) :]))
                self.calls_sent[index] = (name, prefix.arguments)
        return pieces


def _may_repeat(call: CallPrefix, earlier: list[ParsedCall]) -> bool:
    """Whether ``call`` (still being written, or closed) could be, or is, a repeat of one of the
    ``earlier`` calls: the same name, and, once closed, the same arguments (``same_call``). Strings
    compare loosely, so open arguments can turn out to repeat whatever they began as: a call is held
    until it closes when an earlier call has its name."""
    assert call.name is not None
    if not call.closed:
        return any(other.name == call.name for other in earlier)
    return any(same_call(other, ParsedCall(call.name, call.arguments)) for other in earlier)
