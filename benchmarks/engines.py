"""The engines a benchmark compares: tokenmold's own path and the raw engines as their users get them.

``tokenmold`` is the product: ``ShapeCompiler`` (normalize, then the ``auto`` backend: llguidance
for JSON Schemas, xgrammar where llguidance refuses; schema as written, compact layout) followed by
the validation layer. The raw engines are called with their own defaults,
the way vLLM calls them: xgrammar ``compile_json_schema`` (strict mode, any whitespace) and its
non-strict variant, llguidance ``grammar_from_json_schema`` without options, outlines-core
``build_regex_from_schema`` without options. Each adapter reuses the matcher classes of
``tokenmold.grammar.backends``, so masks are filled and tokens committed by exactly the same code everywhere.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from benchmarks.bitmasks import new_bitmask
from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler, ShapeError, Vocabulary
from tokenmold.grammar.backends.base import CompiledGrammar
from tokenmold.grammar.guards.string_format import FORMAT_PATTERNS
from tokenmold.schemas.verdict import VerdictError

if TYPE_CHECKING:
    import torch

#: Every engine name the benchmarks accept, in table order.
ENGINE_NAMES = ("tokenmold", "tokenmold-no-guards", "xgrammar", "xgrammar-nonstrict", "llguidance", "outlines")

_LOG_PREFIX = re.compile(r"^\[[^\]]*\] \S+?:\d+: ")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_NUMBER = re.compile(r"\d+")
#: What every engine compiles and walks once before the corpus (a mask filled before each token of
#: the text): one-offs per process are not charged to the first schema that needs them. For the raw
#: engines those are their vocabulary tables, which any schema builds: a bounded string's is enough
#: (each later schema builds its own regexes; outlines indexes the formats below far slower than
#: the files of a small run).
_VOCABULARY_WARM_UP = (
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}}, "required": ["a"]},
    '{"a":"x"}',
)
#: For tokenmold, also the bound guard's and the pattern guard's per-vocabulary tables and the rows
#: of the formats the pattern guard holds (``TokenmoldEngine.warm_up``), which ``tokenmold serve``'s
#: own warm-up request builds too (``service/engine/warm_up.py``).
_GUARDS_WARM_UP = (
    {
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 8},
            "b": {"type": "string", "pattern": "^[a-z]{2}$"},
            "c": {"type": "string", "format": "uri"},
            "d": {"type": "string", "format": "email"},
        },
        "required": ["a"],
    },
    '{"a":"x","b":"ab","c":"https://example.com","d":"a@example.com"}',
)


def default_tokenizer_dir() -> str:
    """The embedded model's folder (converted on first use): its tokenizer is the one served."""
    from tokenmold.service.engine.model_home import ensure_default_model

    return str(ensure_default_model())


def load_vocabulary(folder: str) -> Vocabulary:
    """The vocabulary of a model folder as the runtime sees it (logits width, every stop id), or of
    a bare tokenizer folder (its own size and EOS ids) when there is no model config."""
    from tokenmold.service.engine.model_info import ModelInfo, stop_token_ids

    if (Path(folder) / "config.json").exists():
        info = ModelInfo.load(folder)
        tokenizer, size, stops = info.tokenizer, info.vocab_size, info.stop_token_ids
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        size, stops = len(tokenizer), stop_token_ids(tokenizer, None)
    return Vocabulary(tokenizer, vocab_size=size, stop_token_ids=stops)


class BenchEngine(ABC):
    """A JSON Schema in, a token-level grammar out, for one vocabulary."""

    name: ClassVar[str]

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    @abstractmethod
    def compile(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        """Compile ``schema``; any exception is a compile error, categorized by ``error_category``."""

    #: The schema and text of ``warm_up``.
    warm_up_with: ClassVar[tuple[dict[str, Any], str]] = _VOCABULARY_WARM_UP

    def warm_up(self) -> None:
        schema, text = self.warm_up_with
        matcher, bitmask = self.compile(schema).matcher(), new_bitmask(self.vocab)
        for token in self.vocab.encode(text):
            matcher.fill_next_token_bitmask(bitmask)
            if not matcher.accept_token(token):
                break  # an engine that spells the text otherwise: warm enough

    def error_category(self, exc: Exception) -> str:
        """A short, stable bucket for a raw engine's error: its class and a normalized first line."""
        message = exc.message if isinstance(exc, ShapeError) else str(exc)
        line = _LOG_PREFIX.sub("", message.strip().split("\n")[0])
        line = _NUMBER.sub("N", _QUOTED.sub("…", line)).strip()
        return f"{type(exc).__name__}: {line[:70]}"

    def final_accepts(self, schema: dict[str, Any] | bool, text: str) -> bool | None:
        """Whether the layer after the mask accepts ``text``; ``None``: there is no such layer, the
        mask's verdict is final."""
        return None


def first_objection(schema: dict[str, Any] | bool, text: str) -> VerdictError | None:
    """The validation layer's first objection to ``text`` as output of ``schema`` (``None``: valid);
    raises when the validator cannot handle the schema."""
    from tokenmold.service.validation.verdicts import check_json

    errors = check_json(text, schema)[1]
    return errors[0] if errors else None


class TokenmoldEngine(BenchEngine):
    """tokenmold as served: ShapeCompiler with default (non-strict) options, the work the engine
    does when it compiles a grammar (the bound guard's pattern rows), then validation."""

    name = "tokenmold"
    #: Whether the guards run beside llguidance's mask (``tokenmold.grammar.guards``).
    guards = True
    warm_up_with = _GUARDS_WARM_UP

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        # No cache: every schema pays its full compile, as for the raw engines.
        self._compiler = ShapeCompiler(vocab, isolation="inline", cache_bytes=0, guards=self.guards)

    def compile(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        compiled = self._compiler.compile(Shape.from_json_schema(schema), CompileOptions())
        assert compiled.token_grammar is not None  # inline compilation always keeps it
        compiled.token_grammar.prepare()  # what the engine does at compile: the guard's rows
        return compiled.token_grammar

    def warm_up(self) -> None:
        super().warm_up()
        for pattern in FORMAT_PATTERNS.values():  # as serve's warm-up request builds them
            self.vocab.bound_table.patterns.rows(pattern)

    def error_category(self, exc: Exception) -> str:
        return exc.code if isinstance(exc, ShapeError) else f"crash: {type(exc).__name__}"

    def final_accepts(self, schema: dict[str, Any] | bool, text: str) -> bool:
        return first_objection(schema, text) is None


class TokenmoldNoGuardsEngine(TokenmoldEngine):
    """tokenmold with its guards off (``tokenmold serve --no-guards``): llguidance gets whole
    schemas, so the two rows say what the guards close and what they save."""

    name = "tokenmold-no-guards"
    guards = False


class XGrammarEngine(BenchEngine):
    """xgrammar's ``compile_json_schema`` with its defaults (strict mode, any whitespace)."""

    name = "xgrammar"
    strict_mode: ClassVar[bool] = True

    def __init__(self, vocab: Vocabulary) -> None:
        import xgrammar as xgr

        super().__init__(vocab)
        self._compiler = xgr.GrammarCompiler(vocab.xgrammar_info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        import xgrammar as xgr

        from tokenmold.grammar.backends.xgrammar import XGrammarCompiled

        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=self.strict_mode)
        return XGrammarCompiled(self._compiler.compile_grammar(grammar), grammar)


class XGrammarNonStrictEngine(XGrammarEngine):
    """xgrammar with ``strict_mode=False``: properties the schema does not list are allowed."""

    name = "xgrammar-nonstrict"
    strict_mode = False


class LLGuidanceEngine(BenchEngine):
    """llguidance's ``grammar_from_json_schema`` without options (flexible whitespace)."""

    name = "llguidance"

    def __init__(self, vocab: Vocabulary) -> None:
        from tokenmold.grammar.backends.llguidance import LLGuidanceBackend

        super().__init__(vocab)
        # llguidance's own tokenizer (its default slices), not the vocabulary's with tokenmold's.
        self._backend = LLGuidanceBackend(vocab, vocab.llguidance_default_tokenizer())

    def compile(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        import llguidance

        return self._backend.compile_grammar(llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))


class OutlinesEngine(BenchEngine):
    """outlines-core's ``build_regex_from_schema`` with its defaults, then its index."""

    name = "outlines"

    def __init__(self, vocab: Vocabulary) -> None:
        from tokenmold.grammar.backends.outlines import OutlinesBackend

        super().__init__(vocab)
        self._backend = OutlinesBackend(vocab)

    def compile(self, schema: dict[str, Any] | bool) -> CompiledGrammar:
        from outlines_core.json_schema import build_regex_from_schema

        return self._backend.compile_regex(build_regex_from_schema(json.dumps(schema)))


_ENGINES: dict[str, type[BenchEngine]] = {
    cls.name: cls
    for cls in (
        TokenmoldEngine,
        TokenmoldNoGuardsEngine,
        XGrammarEngine,
        XGrammarNonStrictEngine,
        LLGuidanceEngine,
        OutlinesEngine,
    )
}


def open_engine(name: str, vocab: Vocabulary) -> BenchEngine:
    return _ENGINES[name](vocab)


@dataclass(frozen=True)
class CompileResult:
    """The first event of every file: did the schema compile, and how long until the first mask."""

    ok: bool
    ttfm_ms: float
    error: str | None = None
    message: str | None = None


def compile_timed(
    engine: BenchEngine, schema: dict[str, Any] | bool, bitmask: torch.Tensor
) -> tuple[CompileResult, CompiledGrammar | None]:
    """Compile and fill the first mask (time to first mask: what a request waits before its first
    token), or the categorized error."""
    started = time.perf_counter()
    try:
        compiled = engine.compile(schema)
        compiled.matcher().fill_next_token_bitmask(bitmask)
    except Exception as exc:  # every engine failure is a result here, not a crash of the bench
        elapsed = (time.perf_counter() - started) * 1e3
        return CompileResult(False, elapsed, engine.error_category(exc), " ".join(str(exc).split())[:300]), None
    return CompileResult(True, (time.perf_counter() - started) * 1e3), compiled
