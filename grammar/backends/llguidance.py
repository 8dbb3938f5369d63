"""llguidance: an Earley parser over regex lexemes that computes each mask on demand.

Every input is first turned into Lark text (JSON Schema through llguidance's ``%json`` directive,
GBNF through the package's own converter, a regex as one lexeme) and then into llguidance's
serialized grammar. The engine spec is that serialized grammar behind ``LLGUIDANCE_MARKER``
(``EngineSpec(kind="grammar")``), which tokenmold's vLLM plugin (``service/vllm_core/vllm_plugin.py``) hands
to llguidance inside vLLM's engine. There is no per-vocabulary precompute: "compiling" builds one
``LLMatcher`` (grammar checks, lexer set-up) that every request's matcher copies, so the cost of a
schema shows up in the first masks rather than at compile time.

llguidance never raises for a bad grammar or token; it enters a sticky error state that we read
back (``is_error``/``get_error``) and turn into the typed errors of ``tokenmold.grammar.errors``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from tokenmold.grammar.backends.base import (
    Backend,
    CompiledGrammar,
    EngineSpec,
    JsonOptions,
    LlguidanceSpec,
    TokenTextMatcher,
)
from tokenmold.grammar.backends.llguidance_tools import tools_lark
from tokenmold.grammar.bitmask_rows import FirstRow
from tokenmold.grammar.bitmask_views import ROWS, Rows
from tokenmold.grammar.errors import (
    CompileFailed,
    GrammarSyntaxError,
    LimitExceeded,
    RegexError,
    SchemaError,
    ShapeError,
    UnsatisfiableSchema,
    UnsupportedFeature,
)
from tokenmold.grammar.guards.held_keywords import strip_bounds
from tokenmold.grammar.guards.schema_guard import BoundGuard, BoundSchema
from tokenmold.grammar.json_layout import COMPACT

if TYPE_CHECKING:
    import torch

    from tokenmold.grammar.tools import ToolCalls
    from tokenmold.grammar.vocabulary import Vocabulary

#: "at 2(6): message" -- where llguidance found an error in Lark text.
_LARK_WHERE = re.compile(r"^at (\d+)\((\d+)\): ")
#: The prefix ``%json`` puts before the schema compiler's own message.
_JSON_PREFIX = "failed to compile JSON schema: "
#: Resident size per byte of grammar text: a rough factor, llguidance does not report its size.
_BYTES_PER_GRAMMAR_BYTE = 16
_BASE_BYTES = 64 * 1024


def _first_message(raw: str) -> tuple[str, int | None, int | None]:
    """llguidance's message without its source excerpt, plus the Lark line and column if given."""
    head = raw.strip().split("\n   1 | ", 1)[0].strip()
    where = _LARK_WHERE.match(head)
    if where is None:
        return head, None, None
    return head[where.end() :], int(where.group(1)), int(where.group(2))


def _schema_error(raw: str) -> ShapeError:
    message = _first_message(raw)[0].removeprefix(_JSON_PREFIX)
    text = f"llguidance: {message}"
    if message.startswith("Unsatisfiable schema"):
        return UnsatisfiableSchema(text)
    if message.startswith(("Unimplemented keys", "Unknown format")) or "not supported" in message:
        return UnsupportedFeature(text)
    if "limit" in message.lower() or "too large" in message.lower():
        return LimitExceeded(text, keyword="llguidance")
    return SchemaError(text)


def _lark_error(raw: str) -> ShapeError:
    message, line, column = _first_message(raw)
    return GrammarSyntaxError(f"llguidance (Lark): {message}", line=line, column=column)


def _regex_error(raw: str) -> ShapeError:
    """The ``error: ...`` line of the regex parser, with the caret column of its excerpt."""
    lines = raw.splitlines()
    reason = next((ln[len("error: ") :] for ln in lines if ln.startswith("error: ")), _first_message(raw)[0])
    caret = next((ln for ln in lines if ln.strip() and set(ln.strip()) == {"^"}), None)
    column = caret.index("^") - 3 if caret is not None else None  # the excerpt is indented by 4
    return RegexError(f"llguidance: {reason}", line=1 if column else None, column=column)


def check_whitespace_pattern(pattern: str) -> str:
    """``pattern`` once llguidance has parsed it, for JSON's whitespace between tokens (vLLM's
    ``whitespace_pattern``); a ``RegexError`` naming ``whitespace_pattern`` otherwise, rather than
    the schema compile's error, which would blame the schema."""
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(pattern))
    if error:
        raise replace(_regex_error(error), keyword="whitespace_pattern")
    return pattern


class LLGuidanceMatcher(TokenTextMatcher):
    """llguidance's matcher, and the bound guard after it where the grammar left string or array bounds
    to it (``tokenmold.grammar.guards.schema_guard``; the engine runs the same guard, see the vLLM plugin)."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        vocab: Vocabulary,
        guard: BoundGuard | None = None,
        first: FirstRow | None = None,
    ) -> None:
        self._matcher = matcher
        self._vocab = vocab
        self._guard = guard
        #: The grammar's first row, shared by its matchers (``None`` once a token is accepted).
        self._first = first
        #: The view of the bitmask last filled (``ROWS``: taken once per tensor, not per matcher).
        self._rows: Rows | None = None

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        # What ``llguidance.torch.fill_next_token_bitmask`` does, without importing that module:
        # it compiles a torch kernel at import time, which costs seconds of torch._dynamo imports.
        rows = self._rows
        if rows is None or rows.tensor is not bitmask:
            rows = self._rows = ROWS.of(bitmask)
            if rows is None:
                raise ValueError("the bitmask must be a contiguous 2-D int32 tensor in CPU memory")
        row, address, size = rows.words[index], rows.row_address(index), rows.row_bytes
        if self._first is not None:
            self._first.fill(row, lambda: self._matcher.unsafe_compute_mask_ptr(address, size))
        else:
            self._matcher.unsafe_compute_mask_ptr(address, size)
        if self._guard is not None:
            self._guard.restrict(row)

    def accept_token(self, token_id: int) -> bool:
        if self.error is not None:
            return False
        if not self._matcher.consume_token(token_id):
            self.error = self._matcher.get_error() or f"token {token_id} is not allowed here"
            return False
        self._first = None
        if self._guard is not None:
            self._guard.feed((token_id,))
        return True

    def is_accepting(self) -> bool:
        return self.error is None and self._matcher.is_accepting()


class LLGuidanceCompiled(CompiledGrammar):
    backend = "llguidance"

    def __init__(
        self, prototype: llguidance.LLMatcher, grammar: str, vocab: Vocabulary, bounds: str | None = None
    ) -> None:
        self._prototype = prototype  # never advanced: each request gets a copy
        self._vocab = vocab
        self.grammar = grammar
        #: The normalized schema whose string and array bounds the bound guard enforces (``None``: none).
        self.bounds = bounds
        self._first_row = FirstRow()

    @cached_property
    def _bound_schema(self) -> BoundSchema:
        assert self.bounds is not None
        return BoundSchema(self.bounds)

    def prepare(self) -> None:
        """Build the rows of the patterns the bound guard holds, as the engine does when it compiles
        the grammar (``service/vllm_core/vllm_plugin.py``); else the first fill reaching each one builds them."""
        if self.bounds is not None:
            self._vocab.bound_table.build_rows(self._bound_schema)

    def matcher(self) -> LLGuidanceMatcher:
        guard = BoundGuard(self._bound_schema, self._vocab.bound_table) if self.bounds is not None else None
        return LLGuidanceMatcher(self._prototype.deep_copy(), self._vocab, guard, self._first_row)

    @property
    def memory_bytes(self) -> int:
        return _BASE_BYTES + _BYTES_PER_GRAMMAR_BYTE * len(self.grammar) + len(self.bounds or "")

    @cached_property
    def engine_spec(self) -> EngineSpec:
        # Computing the fast-forward tokens does not advance the prototype (and warms its lexer).
        forced = tuple(self._prototype.compute_ff_tokens())
        spec = LlguidanceSpec(self.grammar, bounds=self.bounds)
        return EngineSpec("grammar", spec.text, self.backend, forced_tokens=forced)


class LLGuidanceBackend(Backend):
    name = "llguidance"

    def __init__(self, vocab: Vocabulary, ll_tokenizer: Any = None) -> None:
        """``ll_tokenizer``: the ``llguidance.LLTokenizer`` to build matchers with; by default the
        vocabulary's, with tokenmold's slices where the grammar gains by them
        (``llguidance_slices.LLTokenizers``; the benchmarks' raw llguidance passes the defaults)."""
        super().__init__(vocab)
        self._ll_tokenizer = ll_tokenizer

    def compile_json_schema(self, schema: dict[str, Any] | bool, options: JsonOptions) -> LLGuidanceCompiled:
        """Compile llguidance's JSON grammar directly (``grammar_from_json_schema``; through Lark's
        ``%json`` the same schema costs measurably more to parse on MaskBench), with the
        layout options in the schema's ``x-guidance``.

        Two options cannot be honoured as xgrammar honours them. llguidance has no switch for
        strict properties, so ``strict_properties=True`` is refused: the schema must spell it out
        (``additionalProperties: false``). And its whitespace is a repeatable lexeme, so a bounded
        ``whitespace_pattern`` does not bound a gap; any ``max_whitespace`` therefore gives compact
        JSON, the one layout inside every bound. A caller's own ``options.whitespace_pattern`` is
        llguidance's option as llguidance reads it: each gap is any number of the pattern's
        matches, none included (the pattern says which whitespace, not how much).

        With ``options.guards``, the keywords the guards hold leave the grammar (plain strings'
        ``maxLength``, arrays' ``maxItems``, held patterns and formats: llguidance's masks there are
        slow) and the schema guard enforces them (``tokenmold.grammar.guards.schema_guard``);
        without, llguidance gets the whole schema.
        """
        if options.strict_properties:
            raise UnsupportedFeature(
                "llguidance has no strict-properties mode; state additionalProperties: false in the schema",
                keyword="strict_properties",
            )
        bounds = None
        if schema is not False:
            if options.guards:
                stripped = strip_bounds(schema if isinstance(schema, dict) else {})
                if stripped.lengths or stripped.items or stripped.patterns or stripped.anchored:
                    bounds = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
                schema = stripped.schema
            layout = (
                COMPACT.x_guidance
                if options.whitespace_pattern is None
                else {"whitespace_pattern": check_whitespace_pattern(options.whitespace_pattern)}
            )
            schema = {**(schema if isinstance(schema, dict) else {}), "x-guidance": layout}
        return self.compile_grammar(
            llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)), on_error=_schema_error, bounds=bounds
        )

    def compile_tools(self, calls: ToolCalls, options: JsonOptions) -> LLGuidanceCompiled:
        """Tool calls (``llguidance_tools``); one fixed layout whatever ``options.max_whitespace``
        says (arguments as models write them, ``json_layout``), for the reason given in
        ``compile_json_schema``."""
        return self.compile_lark(tools_lark(calls), _schema_error)

    def compile_ebnf(self, grammar: str) -> LLGuidanceCompiled:
        """GBNF (xgrammar's dialect is GBNF-like) or Lark, converted by llguidance's own converter."""
        try:
            lark = any_to_lark(grammar)
        except GbnfToLarkError as exc:
            before = grammar[: exc.pos.pos]
            raise GrammarSyntaxError(
                f"llguidance (GBNF): {str(exc).split(' at line ')[0]}",
                line=before.count("\n") + 1,
                column=exc.pos.pos - (before.rfind("\n") + 1) + 1,
            ) from None
        except Exception as exc:  # the converter also raises bare Exceptions (e.g. unknown rules)
            raise GrammarSyntaxError(f"llguidance (GBNF): {exc}") from None
        return self.compile_lark(lark, _lark_error)

    def compile_regex(self, pattern: str) -> LLGuidanceCompiled:
        return self.compile_lark("start: /" + llguidance.regex_to_lark(pattern) + "/", _regex_error)

    def compile_choice(self, choices: tuple[str, ...]) -> LLGuidanceCompiled:
        """Lark string literals are JSON strings, so JSON escaping is exact for any text."""
        return self.compile_lark("start: " + " | ".join(json.dumps(c) for c in choices), _lark_error)

    def compile_lark(self, lark: str, on_error: Callable[[str], ShapeError] = _lark_error) -> LLGuidanceCompiled:
        """Compile Lark text; ``on_error`` turns llguidance's message into the caller's error type."""
        return self.compile_grammar(llguidance.LLMatcher.grammar_from_lark(lark), on_error=on_error)

    def compile_grammar(
        self,
        grammar: str,
        *,
        on_error: Callable[[str], ShapeError] = lambda raw: CompileFailed(f"llguidance: {_first_message(raw)[0]}"),
        bounds: str | None = None,
    ) -> LLGuidanceCompiled:
        """Compile a grammar in llguidance's own serialized form (what ``LLMatcher.grammar_from_*``
        returns); ``bounds``: the schema whose string and array bounds the bound guard enforces next to it."""
        ll_tokenizer = (
            self.vocab.llguidance_tokenizers.for_grammar(grammar) if self._ll_tokenizer is None else self._ll_tokenizer
        )
        prototype = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if prototype.is_error():
            raise on_error(prototype.get_error())
        return LLGuidanceCompiled(prototype, grammar, self.vocab, bounds)
