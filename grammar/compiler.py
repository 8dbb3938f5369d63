"""The compiler: limits, canonical key, cache, isolated compilation, backend choice.

``ShapeCompiler.compile`` turns a ``Shape`` into an immutable ``CompiledShape`` or raises a typed
``ShapeError``. The engine-facing result is an ``EngineSpec`` (what vLLM compiles and applies first
in its logits chain); the compile itself runs in a killable worker process so that a hostile schema
costs at most ``Limits.compile_timeout_s`` of one worker and nothing of anyone else.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from grammar.backends import get_backend
from grammar.backends.base import CompiledGrammar, EngineSpec, JsonOptions
from grammar.cache import CacheStats, CompileCache
from grammar.errors import CompileTimeout, LimitExceeded, ShapeError
from grammar.limits import DEFAULT_LIMITS, Limits
from grammar.normalize import normalize_schema
from grammar.report import KeywordReport
from grammar.shape import Shape, ShapeKind
from grammar.tools import ToolCalls
from grammar.vocabulary import Vocabulary
from grammar.worker import CompileTask, WorkerPool, compile_task

#: Bump when the normalizer or grammar generation changes what a key compiles to.
COMPILER_VERSION = "3"


@dataclass(frozen=True)
class CompileOptions:
    """Per-request compilation options.

    Parameters
    ----------
    strict:
        OpenAI strict semantics: no properties beyond those listed, every listed property required.
        Default ``False``: the schema as written (unlisted properties allowed unless forbidden).
    max_whitespace:
        Whitespace characters allowed between JSON tokens (bounded; ``0`` for compact JSON).
    """

    strict: bool = False
    max_whitespace: int = 2


@dataclass(frozen=True)
class CompiledShape:
    """A compiled shape: what the engine applies, what validation checks, what the caller is told."""

    key: str
    shape: Shape
    engine_spec: EngineSpec
    report: KeywordReport
    #: The schema the grammar was built from (JSON shapes only).
    normalized_schema: dict[str, Any] | bool | None
    compile_ms: float
    memory_bytes: int
    #: Compiled against the real vocabulary when the compiler runs in-process (benchmarks, tests).
    token_grammar: CompiledGrammar | None = field(default=None, compare=False, repr=False)

    @cached_property
    def text_grammar(self) -> CompiledGrammar:
        """The same grammar compiled without a vocabulary: cheap, used to check whole texts of
        EBNF, regex and choice shapes (always compiled by xgrammar; JSON is checked by jsonschema)."""
        from grammar.backends.xgrammar import XGrammarBackend
        from grammar.vocabulary import EMPTY_VOCABULARY

        if self.engine_spec.backend != "xgrammar":
            raise ValueError(f"text checks need an xgrammar grammar, this one is {self.engine_spec.backend}'s")
        return XGrammarBackend(EMPTY_VOCABULARY).compile_ebnf(self.engine_spec.text)

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete sentence of this shape's grammar."""
        return self.text_grammar.accepts(text)


class ShapeCompiler:
    """Compiles shapes for one vocabulary; thread-safe; one per process is enough.

    Parameters
    ----------
    vocab:
        The model's vocabulary.
    limits:
        Size, depth and time limits.
    cache_bytes:
        Capacity of the compiled-shape cache.
    isolation:
        ``"process"`` (default): compile in killable workers with ``limits.compile_timeout_s``.
        ``"inline"``: compile in the calling thread and keep the token-level grammar (benchmarks
        and tests that walk masks); no timeout can be enforced.
    workers:
        Number of compile worker processes (``isolation="process"``).
    backend:
        The grammar engine that compiles and that the serving engine applies, or ``"auto"``
        (default): per shape, by measured capability (docs/benchmarks.md). JSON Schemas go to
        llguidance (lazy masks: milliseconds to compile where xgrammar precomputes for seconds on
        non-strict objects and long strings, and no valid instance rejected), falling back to
        xgrammar for what llguidance refuses; EBNF (xgrammar's dialect), regexes, choices and
        tools go to xgrammar.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        limits: Limits = DEFAULT_LIMITS,
        cache_bytes: int = 256 * 1024 * 1024,
        isolation: str = "process",
        workers: int = 1,
        backend: str = "auto",
    ) -> None:
        if isolation not in ("process", "inline"):
            raise ValueError("isolation must be 'process' or 'inline'")
        self.vocab = vocab
        self.limits = limits
        self.isolation = isolation
        self.backend_name = backend
        self._cache: CompileCache[CompiledShape] = CompileCache(cache_bytes, lambda c: c.memory_bytes)
        names = ("llguidance", "xgrammar") if backend == "auto" else (backend,)
        self._pool = WorkerPool(vocab.state(), warm_backends=names, size=workers) if isolation == "process" else None
        self._backends = {name: get_backend(name)(vocab) for name in names} if isolation == "inline" else {}

    def compile(self, shape: Shape, options: CompileOptions = CompileOptions()) -> CompiledShape:
        """Compile ``shape`` (cached); raises a ``ShapeError`` subclass on bad input."""
        source = shape.source_text()
        if len(source.encode()) > self.limits.max_schema_bytes:
            raise LimitExceeded(
                f"the {shape.kind.value} is {len(source.encode())} bytes; the limit is "
                f"{self.limits.max_schema_bytes}",
                keyword="max_schema_bytes",
            )
        key = self.key_of(shape, options)
        return self._cache.get_or_compute(key, lambda: self._compile(key, shape, options))

    def key_of(self, shape: Shape, options: CompileOptions) -> str:
        material = json.dumps(
            [COMPILER_VERSION, self.backend_name, self.vocab.fingerprint, shape.kind.value,
             shape.source_text(), options.strict, options.max_whitespace],
            separators=(",", ":"), ensure_ascii=False,
        )
        return hashlib.sha256(material.encode()).hexdigest()

    def _compile(self, key: str, shape: Shape, options: CompileOptions) -> CompiledShape:
        started = time.perf_counter()
        report = KeywordReport()
        normalized: dict[str, Any] | bool | None = None
        if shape.kind is ShapeKind.JSON_SCHEMA:
            result = normalize_schema(shape.source, strict=options.strict, limits=self.limits)
            normalized, report = result.schema, result.report
            # Strictness is already spelled out in the normalized schema (additionalProperties: false,
            # all required); xgrammar's own strict mode is kept for when it is the only backend.
            kind, payload, json_options = "json_schema", normalized, JsonOptions(
                strict_properties=options.strict and self.backend_name == "xgrammar",
                max_whitespace=options.max_whitespace)
        elif shape.kind is ShapeKind.TOOLS:
            calls, report = self._normalize_tools(shape.source)
            kind, payload, json_options = "tools", calls, JsonOptions(max_whitespace=options.max_whitespace)
        else:
            self._check_text_limits(shape)
            kind, json_options = shape.kind.value, None
            payload = list(shape.source) if shape.kind is ShapeKind.CHOICE else shape.source
        token_grammar, spec, memory = self._compile_with(self._backends_for(shape, options), kind, payload, json_options)
        return CompiledShape(
            key=key,
            shape=shape,
            engine_spec=spec,
            report=report,
            normalized_schema=normalized,
            compile_ms=(time.perf_counter() - started) * 1e3,
            memory_bytes=memory + len(spec.text),
            token_grammar=token_grammar,
        )

    def _backends_for(self, shape: Shape, options: CompileOptions) -> tuple[str, ...]:
        """The backends to try, in order (see the class docstring for why)."""
        if self.backend_name != "auto":
            return (self.backend_name,)
        if shape.kind is ShapeKind.JSON_SCHEMA:
            return ("llguidance", "xgrammar")
        return ("xgrammar",)

    def _compile_with(
        self, backends: tuple[str, ...], kind: str, payload: Any, json_options: JsonOptions | None
    ) -> tuple[CompiledGrammar | None, EngineSpec, int]:
        """Compile with the first backend that accepts the input; the last one's error otherwise.
        A limit or a timeout is final: another backend would only spend the same budget again."""
        for i, name in enumerate(backends):
            task = CompileTask(name, kind, payload, json_options)
            try:
                if self._pool is not None:
                    spec, memory = self._pool.run(task, self.limits.compile_timeout_s)
                    return None, spec, memory
                grammar = compile_task(self._backends[name], task)
                return grammar, grammar.engine_spec, grammar.memory_bytes
            except (LimitExceeded, CompileTimeout):
                raise
            except ShapeError:
                if i == len(backends) - 1:
                    raise
        raise AssertionError("no backend to compile with")

    def _normalize_tools(self, calls: ToolCalls) -> tuple[ToolCalls, KeywordReport]:
        """Normalize every function's parameters under its own ``strict``; one report for all, its
        pointers (and any error's) rooted at ``/tools/<i>/parameters`` of the shape's source."""
        if len(calls.tools) > self.limits.max_tools:
            raise LimitExceeded(
                f"{len(calls.tools)} functions; the limit is {self.limits.max_tools}", keyword="max_tools"
            )
        report = KeywordReport()
        tools = []
        for i, tool in enumerate(calls.tools):
            root = f"/tools/{i}/parameters"
            try:
                result = normalize_schema(tool.parameters, strict=tool.strict, limits=self.limits)
            except ShapeError as exc:
                raise replace(
                    exc, message=f"function {tool.name!r}: {exc.message}",
                    pointer=None if exc.pointer is None else root + exc.pointer,
                ) from None
            report.enforced |= result.report.enforced
            for note in result.report.validated_only:
                report.validate_only(root + note.pointer, note.keyword, note.reason)
            tools.append(replace(tool, parameters=result.schema))
        return replace(calls, tools=tuple(tools)), report

    def _check_text_limits(self, shape: Shape) -> None:
        if shape.kind is ShapeKind.REGEX and len(shape.source.encode()) > self.limits.max_pattern_bytes:
            raise LimitExceeded(
                f"the regex is {len(shape.source.encode())} bytes; the limit is "
                f"{self.limits.max_pattern_bytes}",
                keyword="max_pattern_bytes",
            )
        if shape.kind is ShapeKind.CHOICE and len(shape.source) > self.limits.max_enum_values:
            raise LimitExceeded(
                f"{len(shape.source)} choices; the limit is {self.limits.max_enum_values}",
                keyword="max_enum_values",
            )

    def cache_stats(self) -> CacheStats:
        return self._cache.stats()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
