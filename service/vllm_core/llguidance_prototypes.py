"""Parsed llguidance grammars kept per process and copied per request.

A repeated shape is the common case (one schema per application): parsing its grammar again for
every request costs milliseconds, copying a parsed matcher about a microsecond. Both users of
llguidance inside vLLM keep such a cache: the engine core's grammar backend
(``vllm_plugin._compile_llguidance``) and the model runner's forced-token drafter
(``forced_drafts.ForcedTokenProposer``), each in its own process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from tokenmold.grammar.backends.llguidance_slices import LLTokenizers
from tokenmold.grammar.bitmask_rows import FirstRow
from tokenmold.grammar.bitmask_views import ROWS

#: Parsed grammars kept per process (least recently used dropped first).
PROTOTYPE_CACHE_SIZE = 256


class MatcherPrototypes:
    """Parsed matchers keyed by (grammar text, forced prefix); ``copy`` hands out fresh ones."""

    def __init__(self, ll_tokenizer: Any, log_level: int = 1, size: int = PROTOTYPE_CACHE_SIZE) -> None:
        #: vLLM's tokenizer for llguidance and its copy with tokenmold's slices; a grammar parses
        #: with the one the API process compiled it with (``llguidance_slices.LLTokenizers``).
        self._tokenizers = LLTokenizers.of(ll_tokenizer)
        #: For what any token's spelling is (both tokenizers spell alike).
        self.ll_tokenizer = self._tokenizers.sliced
        self._log_level = log_level
        self._size = size
        self._prototypes: OrderedDict[tuple[str, tuple[int, ...]], Any] = OrderedDict()
        #: Each kept prototype's first row (``tokenmold.grammar.bitmask_rows.FirstRow``), dropped with it.
        self._first_rows: dict[tuple[str, tuple[int, ...]], FirstRow] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._prototypes)

    def holds(self, grammar: str, forced: tuple[int, ...] = ()) -> bool:
        """Whether ``copy`` would be a copy now (no parse)."""
        with self._lock:
            return (grammar, forced) in self._prototypes

    def copy(self, grammar: str, forced: tuple[int, ...] = ()) -> Any:
        """A matcher for ``grammar`` past the ``forced`` tokens its request's prompt ends with.

        A grammar that fails (or refuses its forced tokens) is not kept: the matcher returned
        carries llguidance's sticky error for the caller to report.
        """
        import llguidance

        key = (grammar, forced)
        with self._lock:
            prototype = self._prototypes.get(key)
            if prototype is not None:
                self._prototypes.move_to_end(key)
        if prototype is None:  # parsed outside the lock: another grammar's copy need not wait
            prototype = llguidance.LLMatcher(self._tokenizers.for_grammar(grammar), grammar, log_level=self._log_level)
            if forced and not prototype.is_error():
                prototype.consume_tokens(list(forced))
            if prototype.is_error():
                return prototype
            with self._lock:
                self._prototypes[key] = prototype
                if len(self._prototypes) > self._size:
                    self._first_rows.pop(self._prototypes.popitem(last=False)[0], None)
        return prototype.deep_copy()

    def first_row(self, grammar: str, forced: tuple[int, ...] = ()) -> FirstRow | None:
        """The first row every copy of a kept prototype fills alike (``None``: not kept)."""
        key = (grammar, forced)
        with self._lock:
            if key not in self._prototypes:
                return None
            return self._first_rows.setdefault(key, FirstRow())


def start_from(grammar: Any, first: FirstRow) -> None:
    """Until vLLM's ``grammar`` (a ``GuidanceGrammar`` copied from a prototype) accepts a token, its
    rows are the prototype's first row (filled by the first request, copied by the others); the
    masks the plugin wraps around it later restrict that row as they would llguidance's own."""
    accept, fill = grammar.accept_tokens, grammar.fill_bitmask
    fresh = [True]

    def accept_tokens(request_id: str, tokens: list[int]) -> bool:
        fresh[0] = fresh[0] and not tokens
        return bool(accept(request_id, tokens))

    def fill_bitmask(bitmask: Any, idx: int) -> None:
        if fresh[0]:
            first.fill(ROWS.row(bitmask, idx), lambda: fill(bitmask, idx))
        else:
            fill(bitmask, idx)

    grammar.accept_tokens = accept_tokens
    grammar.fill_bitmask = fill_bitmask
