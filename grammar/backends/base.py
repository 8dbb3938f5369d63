"""The one interface every grammar engine implements.

Two lifetimes, as in xgrammar and vLLM's ``backend_types``: a ``CompiledGrammar`` is immutable and
shared (cached across requests); a ``Matcher`` is per-request state that walks it token by token.
A matcher never raises mid-generation: a rejected token puts it into a sticky error state
(``error``), which the caller reads (llguidance's rule).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tokenmold.grammar.errors import UnsupportedFeature
from tokenmold.grammar.toolformats.base import ParsedCall

if TYPE_CHECKING:
    import torch

    from tokenmold.grammar.tools import ToolCalls
    from tokenmold.grammar.vocabulary import Vocabulary


@dataclass(frozen=True)
class JsonOptions:
    """How a JSON Schema becomes a grammar.

    Parameters
    ----------
    strict_properties:
        ``False`` (schema as written): properties that the schema allows but does not list may
        appear. ``True``: only listed properties (xgrammar's strict mode).
    max_whitespace:
        Most whitespace characters allowed between two JSON tokens; ``0`` forces compact JSON.
        Bounded so that no whitespace loop can run to max_tokens.
    guards:
        ``True``: the keywords the guards hold (``tokenmold.grammar.guards.held_keywords``) leave
        the grammar and the spec asks the engine to run the guards in their place. ``False``: the
        grammar engine gets the whole schema and no guard runs (the switch measures what they buy).
    whitespace_pattern:
        The whitespace between JSON tokens as a regular expression, in place of ``max_whitespace``
        (vLLM's ``whitespace_pattern``): llguidance's own option, so the compiler sends a shape
        that has one to llguidance whatever the backend (``LLGuidanceBackend.compile_json_schema``).
    """

    strict_properties: bool = False
    max_whitespace: int = 2
    guards: bool = True
    whitespace_pattern: str | None = None


#: Prefix of a ``grammar`` spec that carries a serialized llguidance grammar (see
#: ``service/vllm_core/vllm_plugin.py``, which teaches vLLM's engine to apply it).
LLGUIDANCE_MARKER = "%tokenmold-llguidance\n"
#: Optional header lines after the marker, in this order (``LlguidanceSpec``).
_UNIQUE_KEYS_LINE = "%unique-keys\n"
_BOUNDS_LINE = "%bounds "
_FIT_LINE = "%fit "
_REPEATED_CALLS_LINE = "%repeated-calls "
_FORCED_LINE = "%forced "


@dataclass(frozen=True)
class FitRequest:
    """Budget fitting asked for (``tokenmold.grammar.budget``): the tokens the engine may generate, the
    normalized schema the tracker follows (compact JSON), and the repetition guard's thresholds
    (``min_repeats, max_period, min_tokens``; ``None``: no guard)."""

    budget: int
    schema: str
    guard: tuple[int, int, int] | None = None

    def line(self) -> str:
        guard = ",".join(map(str, self.guard)) if self.guard else "-"
        return f"{_FIT_LINE}{self.budget} {guard} {self.schema}\n"

    @classmethod
    def read(cls, line: str) -> FitRequest:
        budget, guard, schema = line[len(_FIT_LINE) :].split(" ", 2)
        if guard == "-":
            return cls(int(budget), schema)
        repeats, period, tokens = (int(n) for n in guard.split(","))
        return cls(int(budget), schema, (repeats, period, tokens))


@dataclass(frozen=True)
class CallGuardRequest:
    """The repeated-call guard asked for (``service/vllm_core/repeated_calls.py``): the name of the tool-call
    format whose calls it watches, and the calls the conversation already made and got answers
    for, which it refuses as it refuses a call the output already made."""

    tool_format: str
    answered: tuple[ParsedCall, ...] = ()

    def line(self) -> str:
        answered = json.dumps([[call.name, call.arguments] for call in self.answered], ensure_ascii=False)
        return f"{_REPEATED_CALLS_LINE}{self.tool_format} {answered}\n"

    @classmethod
    def read(cls, line: str) -> CallGuardRequest:
        tool_format, _, answered = line[len(_REPEATED_CALLS_LINE) :].partition(" ")
        return cls(tool_format, tuple(ParsedCall(name, arguments) for name, arguments in json.loads(answered or "[]")))


@dataclass(frozen=True)
class LlguidanceSpec:
    """A spec the plugin compiles: the serialized grammar and what the engine runs next to it.

    ``forced``: tokens the matcher consumes before its first mask, because the request's prompt
    already ends with them (jump-forward, see ``EngineSpec``). ``unique_keys``: the duplicate-key
    guard (``tokenmold.grammar.guards.unique_keys``) runs too, for JSON with explicitly open objects.
    ``bounds``: the normalized schema (compact JSON) whose string ``maxLength``s and array ``maxItems`` the grammar left
    out for the bound guard (``tokenmold.grammar.guards.schema_guard``) to enforce. ``fit``: the
    budget-fitting mask (``tokenmold.grammar.budget``) runs too. ``repeated_calls``: the repeated-call
    guard (``service/vllm_core/repeated_calls.py``) runs too.
    """

    grammar: str
    forced: tuple[int, ...] = ()
    unique_keys: bool = False
    fit: FitRequest | None = None
    bounds: str | None = None
    repeated_calls: CallGuardRequest | None = None

    @classmethod
    def read(cls, text: str) -> LlguidanceSpec | None:
        """The parsed spec, or ``None`` for any other grammar text."""
        if not text.startswith(LLGUIDANCE_MARKER):
            return None
        body = text[len(LLGUIDANCE_MARKER) :]
        unique_keys = body.startswith(_UNIQUE_KEYS_LINE)
        body = body.removeprefix(_UNIQUE_KEYS_LINE)
        bounds = None
        if body.startswith(_BOUNDS_LINE):
            line, _, body = body.partition("\n")
            bounds = line[len(_BOUNDS_LINE) :]
        fit = None
        if body.startswith(_FIT_LINE):
            line, _, body = body.partition("\n")
            fit = FitRequest.read(line)
        repeated_calls = None
        if body.startswith(_REPEATED_CALLS_LINE):
            line, _, body = body.partition("\n")
            repeated_calls = CallGuardRequest.read(line)
        forced: tuple[int, ...] = ()
        if body.startswith(_FORCED_LINE):
            line, _, body = body.partition("\n")
            forced = tuple(int(token) for token in line[len(_FORCED_LINE) :].split(","))
        return cls(body, forced, unique_keys, fit, bounds, repeated_calls)

    @property
    def text(self) -> str:
        forced = _FORCED_LINE + ",".join(map(str, self.forced)) + "\n" if self.forced else ""
        return (
            LLGUIDANCE_MARKER
            + (_UNIQUE_KEYS_LINE if self.unique_keys else "")
            + (f"{_BOUNDS_LINE}{self.bounds}\n" if self.bounds is not None else "")
            + (self.fit.line() if self.fit else "")
            + (self.repeated_calls.line() if self.repeated_calls else "")
            + forced
            + self.grammar
        )


@dataclass(frozen=True)
class EngineSpec:
    """What vLLM's structured-output path is given so that it applies this grammar first in the
    logits chain: a request type of ``StructuredOutputsParams`` and its text.

    ``forced_tokens`` are the tokens the grammar forces from its start (llguidance's fast-forward
    tokens: ``{"name":"get_weather","arguments":{"`` for a one-tool call). A request may put them
    at the end of its prompt and send ``jumped()``'s spec, whose matcher starts after them: they
    cost one prefill instead of one decoding step each.
    """

    kind: Literal["grammar", "json", "regex", "choice", "structural_tag"]
    text: str
    backend: str
    forced_tokens: tuple[int, ...] = ()

    @property
    def llguidance(self) -> LlguidanceSpec | None:
        return LlguidanceSpec.read(self.text)

    def jumped(self) -> EngineSpec:
        """This grammar with its forced tokens already consumed (llguidance specs only)."""
        parsed = self.llguidance
        if parsed is None or parsed.forced or not self.forced_tokens:
            raise ValueError("only an llguidance spec with forced tokens can jump forward")
        return EngineSpec(self.kind, replace(parsed, forced=self.forced_tokens).text, self.backend)

    @property
    def guards_keys(self) -> bool:
        """Whether the engine runs the duplicate-key guard next to this grammar."""
        parsed = self.llguidance
        return parsed is not None and parsed.unique_keys

    def with_key_guard(self) -> EngineSpec:
        """This llguidance spec with the duplicate-key guard asked for."""
        parsed = self.llguidance
        if parsed is None or parsed.unique_keys:
            raise ValueError("only an llguidance spec takes the key guard, once")
        return replace(self, text=replace(parsed, unique_keys=True).text)

    def with_fit(self, fit: FitRequest) -> EngineSpec:
        """This llguidance spec with the budget-fitting mask asked for."""
        parsed = self.llguidance
        if parsed is None:
            raise ValueError("only an llguidance spec takes budget fitting")
        return replace(self, text=replace(parsed, fit=fit).text)

    def with_repeated_call_guard(self, guard: CallGuardRequest) -> EngineSpec:
        """This llguidance spec with the repeated-call guard asked for."""
        parsed = self.llguidance
        if parsed is None:
            raise ValueError("only an llguidance spec takes the repeated-call guard")
        return replace(self, text=replace(parsed, repeated_calls=guard).text)


class Matcher(ABC):
    """Per-request grammar state."""

    error: str | None = None

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        """Write the allowed-token bitmask (int32, 32 tokens a word) into row ``index``."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; ``False`` (and a sticky ``error``) if the grammar forbids it."""

    @abstractmethod
    def accept_text(self, text: str) -> bool:
        """Advance by a whole string, independent of tokenization."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """Whether the grammar is complete here, i.e. a stop token is allowed next."""


class TokenTextMatcher(Matcher):
    """A matcher that consumes only tokens (llguidance, outlines): a text is accepted as the tokens
    of ``vocab.encode(text)``. Their masks allow every token whose bytes fit the grammar, so any
    tokenization of an allowed text passes: in practice the same answer as a byte-level check."""

    _vocab: Vocabulary

    def accept_text(self, text: str) -> bool:
        return all(self.accept_token(token) for token in self._vocab.encode(text))


class CompiledGrammar(ABC):
    """An immutable compiled grammar, shareable between requests and threads."""

    backend: ClassVar[str]

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh per-request matcher at the grammar's start."""

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Approximate resident size, for the byte-bounded cache."""

    @property
    def engine_spec(self) -> EngineSpec | None:
        """How the serving engine applies this grammar, or ``None`` if it cannot."""
        return None

    def prepare(self) -> None:
        """Do what the serving engine does once when it compiles this grammar, so that no step of
        an in-process matcher pays for it (nothing, unless the backend says otherwise)."""
        return None

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete sentence of the grammar."""
        matcher = self.matcher()
        return matcher.accept_text(text) and matcher.is_accepting()


class Backend(ABC):
    """A grammar engine bound to one vocabulary."""

    name: ClassVar[str]

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    @abstractmethod
    def compile_json_schema(self, schema: dict[str, Any] | bool, options: JsonOptions) -> CompiledGrammar:
        """Compile a (normalized) JSON Schema."""

    @abstractmethod
    def compile_ebnf(self, grammar: str) -> CompiledGrammar:
        """Compile an EBNF grammar in xgrammar's GBNF-like dialect."""

    @abstractmethod
    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Compile a regular expression over the whole output."""

    def compile_choice(self, choices: tuple[str, ...]) -> CompiledGrammar:
        """Exactly one of ``choices``: an alternation of string literals."""
        return self.compile_ebnf("root ::= " + " | ".join(ebnf_literal(c) for c in choices))

    def compile_lark(self, lark: str) -> CompiledGrammar:
        """Compile a Lark grammar in llguidance's dialect (``start`` rule)."""
        raise UnsupportedFeature(f"the {self.name} backend cannot compile Lark grammars", keyword="lark")

    def compile_structural_tag(self, tag: dict[str, Any]) -> CompiledGrammar:
        """Compile an xgrammar structural tag (``tokenmold.grammar.structural_tag``)."""
        raise UnsupportedFeature(f"the {self.name} backend cannot compile structural tags", keyword="structural_tag")

    def compile_tools(self, calls: ToolCalls, options: JsonOptions) -> CompiledGrammar:
        """Tool calls in the tagged format of ``tokenmold.grammar.tools`` (parameters already normalized;
        each tool's ``strict`` overrides ``options.strict_properties``). Free text with optional
        calls needs the engine's own trigger-and-dispatch support, so it is per backend."""
        raise UnsupportedFeature(f"the {self.name} backend cannot compile tool calls", keyword="tools")


def ebnf_literal(text: str) -> str:
    """``text`` as a double-quoted EBNF string literal (xgrammar / GBNF escapes)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
