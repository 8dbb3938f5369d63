"""The engine's xgrammar grammars kept in the grammar store (``grammar/store.py``).

vLLM's engine compiles the EBNF of every xgrammar shape tokenmold sends with its own
``xgrammar.GrammarCompiler``, whose cache lives in the engine core's memory: after a restart, or on
another replica, a heavy grammar takes its seconds again, after as long again in the service's
compile worker (docs/operations.md, "The grammar cache on disk"). With a store, the
``grammar-store`` patch (``service/vllm_core/vllm_plugin.py``) puts ``StoredCompiler`` in front of that
compiler: a grammar new to this engine is loaded from the directory when one was kept there
(``CompiledGrammar.deserialize_json``, with the inflating: a fraction of the compile), else
compiled and kept, in a background thread (serializing takes as long as compiling; xgrammar and
zlib release the GIL, so the engine's loop keeps stepping).

llguidance's grammars are not kept: they parse lazily, in milliseconds (docs/benchmarks.md,
"Grammar cache after a restart"), and llguidance has no serialized form of a parsed grammar.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

from tokenmold.grammar.cache import CompileCache
from tokenmold.grammar.store import MIN_COMPILE_S, GrammarStore

#: The key of the store's settings in vLLM's ``additional_config`` (``EngineConfig`` sets them:
#: ``directory``, ``capacity_bytes``); the engine core reads them when vLLM builds its backend.
ENGINE_CONFIG_KEY = "tokenmold_grammar_store"
#: The store's namespace of compiled xgrammar grammars.
NAMESPACE = "xgrammar"

_log = logging.getLogger(__name__)


@cache
def _writer() -> ThreadPoolExecutor:
    """One thread that serializes and writes (not a daemon: an engine that exits finishes its
    writes first)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenmold-grammar-store")


class StoredCompiler:
    """vLLM's ``xgrammar.GrammarCompiler`` with the store in front of ``compile_grammar(str)``
    (how vLLM compiles an EBNF request: tokenmold sends every xgrammar shape as one); every other
    call goes to the compiler as it is.

    Grammars loaded or compiled here are kept in memory too (``CompileCache``, bounded as vLLM
    bounds xgrammar's own cache): a shape's second request neither reads the disk nor compiles,
    and concurrent requests for one new shape wait on one load or compile.
    """

    def __init__(self, compiler: Any, store: GrammarStore, memory_bytes: int) -> None:
        self._compiler = compiler
        self._store = store
        self._memory: CompileCache[Any] = CompileCache(memory_bytes, lambda grammar: int(grammar.memory_size_bytes))
        #: The compiler's own tokenizer info (not an attribute of ``GrammarCompiler``): what a
        #: compiled grammar is bound to, and what a loaded one must be bound to again.
        self._tokenizer_info = compiler.compile_grammar('root ::= "a"').tokenizer_info
        #: The whole vocabulary and its metadata: xgrammar's own check on load compares only the
        #: metadata (vocabulary type and size, stop tokens), not the tokens. Made here, when vLLM
        #: builds its backend (the warm-up request), not on a shape's first request (which would wait).
        self._tokenizer_digest = hashlib.sha256(self._tokenizer_info.serialize_json().encode()).hexdigest()

    def compile_grammar(self, grammar: Any, **options: Any) -> Any:
        if not isinstance(grammar, str) or options:
            return self._compiler.compile_grammar(grammar, **options)
        key = f"{self._tokenizer_digest}\n{grammar}"
        return self._memory.get_or_compute(key, lambda: self._load_or_compile(key, grammar))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiler, name)

    def _load_or_compile(self, key: str, grammar: str) -> Any:
        import xgrammar as xgr

        payload = self._store.load(NAMESPACE, key)
        if payload is not None:
            try:
                return xgr.CompiledGrammar.deserialize_json(payload.decode(), self._tokenizer_info)
            except (RuntimeError, ValueError) as exc:  # xgrammar's Deserialize*Error, InvalidJSONError
                _log.warning("grammar store: a stored grammar did not load (%s); compiling again", exc)
        started = time.perf_counter()
        compiled = self._compiler.compile_grammar(grammar)
        if time.perf_counter() - started >= MIN_COMPILE_S:
            _writer().submit(self._save, key, compiled)
        return compiled

    def _save(self, key: str, compiled: Any) -> None:
        try:
            self._store.save(NAMESPACE, key, compiled.serialize_json().encode())
        except Exception:  # a background write must never take the engine down: logged instead
            _log.warning("grammar store: cannot keep a compiled grammar", exc_info=True)


def stored_compiler(compiler: Any, settings: dict[str, Any]) -> StoredCompiler:
    """``compiler`` behind a store opened from ``ENGINE_CONFIG_KEY``'s ``settings``."""
    import vllm.envs

    store = GrammarStore(settings["directory"], settings["capacity_bytes"])
    return StoredCompiler(compiler, store, vllm.envs.VLLM_XGRAMMAR_CACHE_MB * 2**20)
