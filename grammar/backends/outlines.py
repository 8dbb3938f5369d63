"""outlines-core: a JSON Schema becomes one regex, the regex one token-level DFA (``Index``).

All the work is done at compile time (the index maps every DFA state to its allowed tokens), so
masks are a table look-up but compiling a large schema can take very long; the regex language
cannot express recursion, so recursive schemas are cut at a fixed depth by outlines-core itself.
There is no EBNF support. The engine spec is the regex (``EngineSpec(kind="regex")``), which vLLM's
outlines backend compiles again on its side.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import outlines_core
from outlines_core.json_schema import build_regex_from_schema

from tokenmold.grammar.backends.base import Backend, CompiledGrammar, EngineSpec, JsonOptions, TokenTextMatcher
from tokenmold.grammar.errors import (
    CompileFailed,
    RegexError,
    SchemaError,
    ShapeError,
    UnsatisfiableSchema,
    UnsupportedFeature,
)
from tokenmold.grammar.jsonschema.fold import fold_llguidance_only

if TYPE_CHECKING:
    import torch

    from tokenmold.grammar.vocabulary import Vocabulary

#: Characters with a meaning in Rust regex syntax; escaping them (and only them) makes a literal.
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


class OutlinesMatcher(TokenTextMatcher):
    def __init__(self, index: outlines_core.Index, vocab: Vocabulary) -> None:
        self._guide = outlines_core.Guide(index)
        self._vocab = vocab
        self._stopped = False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        row = bitmask[index]
        self._guide.write_mask_into(row.data_ptr(), row.numel(), row.element_size())

    def accept_token(self, token_id: int) -> bool:
        """Advance the DFA; a stop token is accepted (and ends the walk) only in a final state.

        outlines-core allows EOS in a final state but cannot advance on it (as vLLM notes in its
        ``OutlinesGrammar``), so stopping is tracked here.
        """
        if self.error is not None:
            return False
        if self._stopped:
            self.error = "no token may follow the stop token"
        elif token_id in self._vocab.stop_token_ids:
            if self._guide.is_finished():
                self._stopped = True
                return True
            self.error = f"stop token {token_id} before the output is complete"
        else:
            try:
                self._guide.advance(token_id, return_tokens=False)
                return True
            except ValueError:
                self.error = f"token {token_id} is not allowed here"
        return False

    def is_accepting(self) -> bool:
        return self.error is None and self._guide.is_finished()


class OutlinesCompiled(CompiledGrammar):
    backend = "outlines"

    def __init__(self, index: outlines_core.Index, regex: str, vocab: Vocabulary) -> None:
        self.index = index
        self.regex = regex
        self._vocab = vocab

    def matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self.index, self._vocab)

    @cached_property
    def memory_bytes(self) -> int:
        """The index's serialized size: its transition table is nearly all of its memory."""
        return len(pickle.dumps(self.index)) + len(self.regex)

    @property
    def engine_spec(self) -> EngineSpec:
        return EngineSpec(kind="regex", text=self.regex, backend=self.backend)


class OutlinesBackend(Backend):
    name = "outlines"

    def compile_json_schema(self, schema: dict[str, Any] | bool, options: JsonOptions) -> OutlinesCompiled:
        """Schema -> regex -> index.

        outlines-core only ever generates the properties a schema lists, so ``strict_properties``
        has no effect: non-strict schemas get a mask stricter than the schema (never looser).
        """
        if schema is False:
            raise UnsatisfiableSchema("the schema is false", pointer="")
        whitespace = f"[ \\n\\t\\r]{{0,{options.max_whitespace}}}" if options.max_whitespace else ""
        text = json.dumps({} if schema is True else fold_llguidance_only(schema))
        try:
            regex = build_regex_from_schema(text, whitespace_pattern=whitespace)
        except ValueError as exc:
            message = str(exc).split("\n")[0].strip()
            unsupported = "nsupported" in message or "not supported" in message
            raise (UnsupportedFeature if unsupported else SchemaError)(f"outlines: {message}") from None
        return self._index(regex, lambda message: CompileFailed(f"outlines: {message}"))

    def compile_ebnf(self, grammar: str) -> OutlinesCompiled:
        raise UnsupportedFeature("outlines-core has no grammar support; use a JSON Schema or a regex")

    def compile_regex(self, pattern: str) -> OutlinesCompiled:
        return self._index(pattern, lambda message: RegexError(f"outlines: {message}"))

    def compile_choice(self, choices: tuple[str, ...]) -> OutlinesCompiled:
        """An alternation of escaped literals (the base class goes through EBNF, which outlines lacks)."""
        literals = ("".join("\\" + ch if ch in _REGEX_META else ch for ch in choice) for choice in choices)
        return self._index("(" + "|".join(literals) + ")", lambda message: CompileFailed(f"outlines: {message}"))

    def _index(self, regex: str, error: Callable[[str], ShapeError]) -> OutlinesCompiled:
        try:
            index = outlines_core.Index(regex, self.vocab.outlines_vocabulary)
        except ValueError as exc:
            raise error(str(exc).strip()) from None
        return OutlinesCompiled(index, regex, self.vocab)
