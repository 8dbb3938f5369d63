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
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tokenmold.grammar.backends import get_backend
from tokenmold.grammar.backends.base import CompiledGrammar, EngineSpec, JsonOptions
from tokenmold.grammar.budget.floor import OutputFloor, output_floor
from tokenmold.grammar.cache import CacheStats, CompileCache
from tokenmold.grammar.errors import CompileTimeout, LimitExceeded, ShapeError
from tokenmold.grammar.jsonschema import normalize_schema
from tokenmold.grammar.lanes import estimate_lane
from tokenmold.grammar.limits import DEFAULT_LIMITS, Limits
from tokenmold.grammar.object_keys import DEFAULT_MAX_EXTRA_PROPERTIES, mark_open, narrow_objects, opens_objects
from tokenmold.grammar.report import KeywordCoverage
from tokenmold.grammar.shape import Shape, ShapeKind
from tokenmold.grammar.store import MIN_COMPILE_S, GrammarStore
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import ToolCalls
from tokenmold.grammar.vocabulary import Vocabulary
from tokenmold.grammar.worker import CompileTask, PoolStats, WorkerPool, compile_task, default_workers

if TYPE_CHECKING:
    from tokenmold.grammar.backends.llguidance_text import ByteGrammar

#: Bump when the normalizer or grammar generation changes what a key compiles to.
COMPILER_VERSION = "5"
#: The store's namespace of the compile workers' results (``store``).
STORE_NAMESPACE = "shapes"


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
    max_extra_properties:
        Keys an explicitly open object may get beyond those it lists (``tokenmold.grammar.object_keys``;
        an object that does not state ``additionalProperties`` gets only its listed properties).
    whitespace_pattern:
        A JSON Schema's whitespace between tokens as a regular expression (vLLM's
        ``whitespace_pattern``; ``JsonOptions``), in place of ``max_whitespace``.
    """

    strict: bool = False
    max_whitespace: int = 2
    max_extra_properties: int = DEFAULT_MAX_EXTRA_PROPERTIES
    whitespace_pattern: str | None = None


@dataclass(frozen=True)
class CompiledShape:
    """A compiled shape: what the engine applies, what validation checks, what the caller is told."""

    key: str
    shape: Shape
    engine_spec: EngineSpec
    report: KeywordCoverage
    #: The schema the grammar was built from (JSON shapes only).
    normalized_schema: dict[str, Any] | bool | None
    compile_ms: float
    memory_bytes: int
    #: The shortest output the schema allows, in tokens (JSON shapes; ``None`` where unknowable):
    #: a request whose max_tokens cannot hold it is refused before decoding.
    output_floor: OutputFloor | None = None
    #: A tool shape's calls with their parameters normalized (what the grammar was built from).
    normalized_calls: ToolCalls | None = field(default=None, compare=False, repr=False)
    #: Compiled against the real vocabulary when the compiler runs in-process (benchmarks, tests).
    token_grammar: CompiledGrammar | None = field(default=None, compare=False, repr=False)

    @cached_property
    def text_grammar(self) -> CompiledGrammar | ByteGrammar:
        """The same grammar compiled without the model's vocabulary: cheap, used to check whole
        texts of grammar, regex, choice and structural-tag shapes (JSON is checked by jsonschema):
        xgrammar's EBNF with no vocabulary, llguidance's grammar over bytes (``llguidance_text``)."""
        from tokenmold.grammar.backends.llguidance_text import ByteGrammar
        from tokenmold.grammar.backends.xgrammar import XGrammarBackend
        from tokenmold.grammar.vocabulary import EMPTY_VOCABULARY

        parsed = self.engine_spec.llguidance
        if parsed is not None:
            return ByteGrammar(parsed.grammar)
        if self.engine_spec.backend != "xgrammar":
            raise ValueError(f"text checks need an xgrammar grammar, this one is {self.engine_spec.backend}'s")
        return XGrammarBackend(EMPTY_VOCABULARY).compile_ebnf(self.engine_spec.text)

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete sentence of this shape's grammar (the token-level grammar
        where the compile kept it, as inline compiles do for any backend)."""
        return (self.token_grammar or self.text_grammar).accepts(text)


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
        Compile worker processes (``isolation="process"``); ``None``: sized to the machine
        (``default_workers``). Cheap and heavy compiles run in separate lanes (``grammar/lanes.py``).
    queue_timeout_s:
        Longest wait for a free compile worker (then a transient ``CompileUnavailable``);
        ``None``: ``limits.compile_timeout_s``.
    backend:
        The grammar engine that compiles and that the serving engine applies, or ``"auto"``
        (default): per shape, by measured capability (docs/benchmarks.md). JSON Schemas go to
        llguidance (lazy masks: milliseconds to compile where xgrammar precomputes for seconds on
        non-strict objects and long strings, and no valid instance rejected), falling back to
        xgrammar for what llguidance refuses; tool sets too (milliseconds for 128 functions where
        xgrammar's structural tags take seconds: ``tokenmold bench tools``); EBNF (xgrammar's
        dialect), regexes and choices go to xgrammar. Whatever this says, Lark grammars go to
        llguidance and structural tags to xgrammar: each is the one engine that reads them in full;
        so do JSON Schemas with a ``whitespace_pattern`` to llguidance, the one engine that has one.
    guards:
        ``True`` (default): llguidance's grammars leave the keywords the guards hold to them
        (``tokenmold.grammar.guards``), and a JSON shape with an explicitly open object gets the
        duplicate-key guard. ``False``: the grammar engines get the whole schema and the specs ask
        the engine for no guard; validation judges every output either way. Part of the cache key.
    store:
        Compiled grammars on disk (``grammar/store.py``), shared with other processes and kept
        across restarts: what a compile worker returns (the engine's spec) is kept there under the
        cache key when it took ``MIN_COMPILE_S`` or more, and a shape new to this process is loaded
        from there before any worker compiles it (``isolation="process"``; an inline compile keeps
        the token-level grammar, which is not stored).
    """

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        limits: Limits = DEFAULT_LIMITS,
        cache_bytes: int = 256 * 1024 * 1024,
        isolation: str = "process",
        workers: int | None = None,
        queue_timeout_s: float | None = None,
        backend: str = "auto",
        guards: bool = True,
        store: GrammarStore | None = None,
    ) -> None:
        if isolation not in ("process", "inline"):
            raise ValueError("isolation must be 'process' or 'inline'")
        self.vocab = vocab
        self.limits = limits
        self.isolation = isolation
        self.backend_name = backend
        self.guards = guards
        self.store = store
        self._cache: CompileCache[CompiledShape] = CompileCache(cache_bytes, lambda c: c.memory_bytes)
        names = ("llguidance", "xgrammar") if backend == "auto" else (backend,)
        self._pool = (
            WorkerPool(
                vocab.state(),
                warm_backends=names,
                size=workers or default_workers(),
                queue_timeout_s=limits.compile_timeout_s if queue_timeout_s is None else queue_timeout_s,
            )
            if isolation == "process"
            else None
        )
        self._backends = {name: get_backend(name)(vocab) for name in names} if isolation == "inline" else {}

    def compile(self, shape: Shape, options: CompileOptions = CompileOptions()) -> CompiledShape:
        """Compile ``shape`` (cached); raises a ``ShapeError`` subclass on bad input."""
        size = len(shape.source_bytes)
        if size > self.limits.max_schema_bytes:
            raise LimitExceeded(
                f"the {shape.kind.value} is {size} bytes; the limit is {self.limits.max_schema_bytes}",
                keyword="max_schema_bytes",
            )
        key = self.key_of(shape, options)
        return self._cache.get_or_compute(key, lambda: self._compile(key, shape, options))

    def key_of(self, shape: Shape, options: CompileOptions) -> str:
        """The cache key: everything a compile depends on, the source last (hashed as it is, not
        escaped again: 128 tools' text is ~60 kB)."""
        header = json.dumps(
            [
                COMPILER_VERSION,
                self.backend_name,
                self.guards,
                self.vocab.fingerprint,
                shape.kind.value,
                options.strict,
                options.max_whitespace,
                options.max_extra_properties,
                options.whitespace_pattern,
            ],
            separators=(",", ":"),
        )
        digest = hashlib.sha256(header.encode())
        digest.update(b"\n")
        digest.update(shape.source_bytes)
        return digest.hexdigest()

    def _compile(self, key: str, shape: Shape, options: CompileOptions) -> CompiledShape:
        started = time.perf_counter()
        report = KeywordCoverage()
        normalized: dict[str, Any] | bool | None = None
        # What the backend compiles: a normalized schema, tool calls, choices, or grammar text.
        payload: dict[str, Any] | bool | ToolCalls | list[str] | str
        if shape.kind is ShapeKind.JSON_SCHEMA:
            normalized, report = self._normalize(shape.source, strict=options.strict, options=options)
            # Strictness is already spelled out in the normalized schema (additionalProperties: false,
            # all required); xgrammar's own strict mode is kept for when it is the only backend.
            kind, payload, json_options = (
                "json_schema",
                normalized,
                JsonOptions(
                    strict_properties=options.strict and self.backend_name == "xgrammar",
                    max_whitespace=options.max_whitespace,
                    guards=self.guards,
                    whitespace_pattern=options.whitespace_pattern,
                ),
            )
        elif shape.kind is ShapeKind.TOOLS:
            calls, report = self._normalize_tools(shape.source, options)
            if isinstance(calls.tool_format, RegistryFormat):
                fmt = calls.tool_format.prepared(calls.tools, required=calls.required, parallel=calls.parallel)
                calls = replace(calls, tool_format=fmt)
            kind, payload, json_options = "tools", calls, JsonOptions(max_whitespace=options.max_whitespace)
        else:
            self._check_text_limits(shape)
            kind, json_options = shape.kind.value, None
            payload = list(shape.source) if shape.kind is ShapeKind.CHOICE else shape.source
        token_grammar, spec, memory = self._compile_with(
            key, self._backends_for(shape, options), kind, payload, json_options, len(shape.source_bytes)
        )
        report = report.for_engine(spec.backend)
        floor = output_floor(normalized, self.vocab) if normalized is not None else None
        if self.guards and kind == "json_schema" and spec.backend == "llguidance" and opens_objects(report):
            spec = spec.with_key_guard()  # layout.py: repeated keys are beyond any grammar
        return CompiledShape(
            key=key,
            shape=shape,
            engine_spec=spec,
            report=report,
            normalized_schema=normalized,
            compile_ms=(time.perf_counter() - started) * 1e3,
            memory_bytes=memory + len(spec.text),
            output_floor=floor,
            token_grammar=token_grammar,
            normalized_calls=payload if isinstance(payload, ToolCalls) else None,
        )

    def _backends_for(self, shape: Shape, options: CompileOptions) -> tuple[str, ...]:
        """The backends to try, in order (see the class docstring for why)."""
        if shape.kind is ShapeKind.LARK:  # whatever the backend: only llguidance reads Lark in full
            return ("llguidance",)
        if shape.kind is ShapeKind.STRUCTURAL_TAG:  # whatever the backend: xgrammar's own format
            return ("xgrammar",)
        if shape.kind is ShapeKind.JSON_SCHEMA and options.whitespace_pattern is not None:
            return ("llguidance",)  # whatever the backend: only llguidance has a whitespace pattern
        if shape.kind is ShapeKind.TOOLS and isinstance(shape.source.tool_format, RegistryFormat):
            return ("xgrammar",)  # the registries' formats are structural tags too
        if self.backend_name != "auto":
            return (self.backend_name,)
        if shape.kind in (ShapeKind.JSON_SCHEMA, ShapeKind.TOOLS):
            return ("llguidance", "xgrammar")
        return ("xgrammar",)

    def _compile_with(
        self,
        key: str,
        backends: tuple[str, ...],
        kind: str,
        payload: Any,
        json_options: JsonOptions | None,
        source_bytes: int,
    ) -> tuple[CompiledGrammar | None, EngineSpec, int]:
        """Compile with the first backend that accepts the input; the last one's error otherwise.
        A limit or a timeout is final: another backend would only spend the same budget again."""
        for i, name in enumerate(backends):
            task = CompileTask(name, kind, payload, json_options)
            try:
                if self._pool is not None:
                    spec, memory = self._pooled(key, task, source_bytes)
                    return None, spec, memory
                backend = self._backends.get(name) or self._backends.setdefault(name, get_backend(name)(self.vocab))
                grammar = compile_task(backend, task)
                return grammar, grammar.engine_spec, grammar.memory_bytes
            except (LimitExceeded, CompileTimeout):
                raise
            except ShapeError:
                if i == len(backends) - 1:
                    raise
        raise AssertionError("no backend to compile with")

    def _pooled(self, key: str, task: CompileTask, source_bytes: int) -> tuple[EngineSpec, int]:
        """A compile worker's result for ``task``: from the store when it holds it, else compiled
        (and stored when it took long enough to be worth loading)."""
        assert self._pool is not None
        stored_key = f"{key}\n{task.backend}"
        stored = self.store.load(STORE_NAMESPACE, stored_key) if self.store is not None else None
        if stored is not None:
            try:
                fields = json.loads(stored)
                spec = EngineSpec(fields["kind"], fields["text"], fields["backend"], tuple(fields["forced_tokens"]))
                return spec, int(fields["memory_bytes"])
            except (ValueError, KeyError, TypeError):  # a payload of another layout: compiled again
                pass
        started = time.perf_counter()
        spec, memory = self._pool.run(task, self.limits.compile_timeout_s, estimate_lane(task, source_bytes))
        if self.store is not None and time.perf_counter() - started >= MIN_COMPILE_S:
            fields = {**asdict(spec), "memory_bytes": memory}
            self.store.save(STORE_NAMESPACE, stored_key, json.dumps(fields).encode())
        return spec, memory

    def _normalize(
        self, schema: dict[str, Any] | bool, *, strict: bool, options: CompileOptions
    ) -> tuple[dict[str, Any] | bool, KeywordCoverage]:
        """Normalize, then lay objects out (closed unless open by the schema's own words)."""
        result = normalize_schema(mark_open(schema), strict=strict, limits=self.limits)
        return narrow_objects(result.schema, result.report, options.max_extra_properties), result.report

    def _normalize_tools(self, calls: ToolCalls, options: CompileOptions) -> tuple[ToolCalls, KeywordCoverage]:
        """Normalize every function's parameters under its own ``strict``; one report for all, its
        pointers (and any error's) rooted at ``/tools/<i>/parameters`` of the shape's source, and
        the answer format's (if any) at ``/answer``."""
        if len(calls.tools) > self.limits.max_tools:
            raise LimitExceeded(
                f"{len(calls.tools)} functions; the limit is {self.limits.max_tools}", keyword="max_tools"
            )
        report = KeywordCoverage()
        tools = []
        for i, tool in enumerate(calls.tools):
            root = f"/tools/{i}/parameters"
            try:
                parameters, own = self._normalize(tool.parameters, strict=tool.strict, options=options)
            except ShapeError as exc:
                raise replace(
                    exc,
                    message=f"function {tool.name!r}: {exc.message}",
                    pointer=None if exc.pointer is None else root + exc.pointer,
                ) from None
            _add_notes(report, own, root)
            tools.append(replace(tool, parameters=parameters))
        if calls.answer is None:
            return replace(calls, tools=tuple(tools)), report
        answer, own = self._normalize(calls.answer, strict=calls.answer_strict, options=options)
        _add_notes(report, own, "/answer")
        return replace(calls, tools=tuple(tools), answer=answer), report

    def _check_text_limits(self, shape: Shape) -> None:
        if shape.kind is ShapeKind.REGEX and len(shape.source.encode()) > self.limits.max_pattern_bytes:
            raise LimitExceeded(
                f"the regex is {len(shape.source.encode())} bytes; the limit is {self.limits.max_pattern_bytes}",
                keyword="max_pattern_bytes",
            )
        if shape.kind is ShapeKind.CHOICE and len(shape.source) > self.limits.max_enum_values:
            raise LimitExceeded(
                f"{len(shape.source)} choices; the limit is {self.limits.max_enum_values}",
                keyword="max_enum_values",
            )

    def cache_stats(self) -> CacheStats:
        return self._cache.stats()

    def pool_stats(self) -> PoolStats | None:
        """The compile pool's lanes and workers (``None`` when compiling inline)."""
        return self._pool.stats() if self._pool is not None else None

    def worker_pids(self, *, busy: bool = False) -> list[int]:
        """The compile workers' process ids (``busy``: those compiling now)."""
        return self._pool.worker_pids(busy=busy) if self._pool is not None else []

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def _add_notes(report: KeywordCoverage, own: KeywordCoverage, root: str) -> None:
    """Fold one schema's report into a tool set's, its pointers rooted at ``root``."""
    report.enforced |= own.enforced
    for note in own.validated_only:
        report.validate_only(root + note.pointer, note.keyword, note.reason)
    for note in own.narrowed:
        report.narrow(root + note.pointer, note.keyword, note.reason)
    report.llguidance_only |= {replace(note, pointer=root + note.pointer) for note in own.llguidance_only}
