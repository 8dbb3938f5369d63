"""Budget fitting on the request path: what a ``budget: "fit"`` request asks of the engine, and what
the budget did to each of its outputs (``tokenmold.grammar.budget`` holds the logic itself).

The engine runs the mask (``service/vllm_core/vllm_plugin.py``); this side builds the request's spec line and,
once an output is back, replays it through the same grammar and ``Fitter`` for the verdict's
``fitted`` / ``cut``. Both sides keep their per-shape state (plan costs, cached trials) keyed by the
normalized schema, so a shape's second request pays for nothing twice.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import replace
from functools import cached_property
from typing import Any

from tokenmold.grammar import CompiledShape, Shape, ShapeKind, Vocabulary
from tokenmold.grammar.backends.base import EngineSpec, FitRequest
from tokenmold.grammar.backends.llguidance import LLGuidanceBackend, LLGuidanceCompiled
from tokenmold.grammar.budget.coverage import first_gap
from tokenmold.grammar.budget.fitter import Fitting, TokenTable
from tokenmold.grammar.budget.replay import FitOutcome, replay
from tokenmold.grammar.budget.schema import CallLayout, first_byte_kinds
from tokenmold.grammar.guards.unique_keys import KeyGuard, TokenIndex
from tokenmold.grammar.json_layout import ARGUMENTS
from tokenmold.grammar.toolformats.registry import RegistryFormat
from tokenmold.grammar.tools import ToolCalls
from tokenmold.service.errors import FitUnplannable, RequestError
from tokenmold.service.request.repetition import RepetitionGuard

#: Shapes whose fitting state and replay grammar are kept.
CACHE_SIZE = 64


class BudgetFitting:
    """Per runtime: builds fit requests and replays outputs (thread-safe)."""

    def __init__(self, vocab: Vocabulary, guard: RepetitionGuard | None) -> None:
        self.vocab = vocab
        self.guard = guard
        self._lock = threading.Lock()
        self._fittings: OrderedDict[str, Fitting] = OrderedDict()
        self._grammars: OrderedDict[tuple[str, str | None], LLGuidanceCompiled] = OrderedDict()

    @cached_property
    def table(self) -> TokenTable:
        return TokenTable.from_llguidance(self.vocab.llguidance_tokenizer)

    def request(self, compiled: CompiledShape | None, spec: EngineSpec | None, budget: int) -> EngineSpec:
        """``spec`` with budget fitting asked for, for an engine budget of ``budget`` tokens; a
        shape fitting cannot serve is a 400 naming the field."""
        target = _fit_target(compiled)
        if spec is None or spec.llguidance is None:
            backend = spec.backend if spec is not None else "no grammar engine"
            raise RequestError(
                f"budget 'fit' runs with the llguidance grammar engine, and this shape compiled with {backend}",
                param="budget",
            )
        gap = first_gap(target)
        if gap is not None:
            raise FitUnplannable(
                f"budget 'fit' cannot plan the shortest answer of this shape at {gap.pointer or '/'}: {gap.reason}",
                param="budget",
            )
        schema = json.dumps(target, separators=(",", ":"), ensure_ascii=False)
        guard = self.guard
        numbers = (guard.min_repeats, guard.max_period, guard.min_tokens) if guard else None
        return spec.with_fit(FitRequest(budget, schema, numbers))

    def outcome(self, spec: EngineSpec, token_ids: list[int]) -> FitOutcome:
        """What the budget did to the output ``token_ids`` (its forced prefix included) of a request
        sent with ``spec`` (as ``request`` returned it)."""
        parsed = spec.llguidance
        assert parsed is not None and parsed.fit is not None
        fitting = self._fitting(parsed.fit.schema)
        grammar = self._grammar(parsed.grammar, parsed.bounds)
        detector = RepetitionGuard(*parsed.fit.guard).detector() if parsed.fit.guard else None
        key_guard = None
        if parsed.unique_keys:
            key_guard = KeyGuard(TokenIndex((t, b) for t, b in enumerate(self.table.by_id)))
        forced = parsed.forced
        return replay(
            fitting,
            grammar.matcher(),
            budget=parsed.fit.budget,
            forced=forced,
            tokens=token_ids[len(forced) :],
            detector=detector,
            guard=key_guard,
        )

    def _fitting(self, schema: str) -> Fitting:
        with self._lock:
            found = self._fittings.get(schema)
            if found is None:
                found = self._fittings[schema] = Fitting(json.loads(schema), self.table)
                _trim(self._fittings)
            self._fittings.move_to_end(schema)
            return found

    def _grammar(self, grammar: str, bounds: str | None) -> LLGuidanceCompiled:
        """The request's grammar as the engine ran it: with the bound guard if it had one."""
        key = (grammar, bounds)
        with self._lock:
            found = self._grammars.get(key)
            if found is None:
                found = self._grammars[key] = LLGuidanceBackend(self.vocab).compile_grammar(grammar, bounds=bounds)
                _trim(self._grammars)
            self._grammars.move_to_end(key)
            return found


def fitted_layout(shape: Shape) -> Shape:
    """``shape`` as budget fitting generates it: tool-call arguments, which the model otherwise
    lays out as it likes, in the one layout the plan prices (``json_layout.ARGUMENTS``)."""
    if shape.kind is not ShapeKind.TOOLS or shape.source.arguments_layout is not None:
        return shape
    return replace(shape, source=replace(shape.source, arguments_layout=ARGUMENTS))


def _fit_target(compiled: CompiledShape | None) -> Any:
    """What the fitting tracker follows: the normalized schema, or tool calls' layout and their
    normalized parameters; a 400 naming ``budget`` where there is nothing it can follow."""
    calls = compiled.normalized_calls if compiled is not None else None
    if calls is not None:
        return _calls_layout(calls)
    if compiled is None or not compiled.shape.is_json or compiled.normalized_schema is None:
        raise RequestError(
            "budget 'fit' needs a JSON output shape (response_format json_schema or json_object) or tool calls; "
            "for grammar, regex and choice it is not available",
            param="budget",
        )
    return compiled.normalized_schema


def _calls_layout(calls: ToolCalls) -> Any:
    """Tool calls as the tracker follows them (``CallLayout``): required calls; with ``tool_choice:
    auto``, free text that a call may interrupt (it may end anywhere; a call begun must close), or
    the calls or a JSON answer (a response format given with the tools), told apart by the first
    byte. A 400 naming ``budget`` for a layout the tracker cannot follow."""
    if isinstance(calls.tool_format, RegistryFormat):
        raise FitUnplannable(
            f"budget 'fit' with tools needs a tool-call format written by tokenmold (hermes, llama3_json, mistral): "
            f"the fit planner follows one call syntax, and {calls.tool_format.name}'s is the registry's structural tag",
            param="budget",
        )
    syntax = calls.tool_format.syntax
    begins = tuple(syntax.begin(tool.name).encode() for tool in calls.tools)
    if calls.arguments_layout is None:
        raise RequestError(
            "budget 'fit' with tools needs the arguments in one layout: compile the shape for fitting "
            "(tokenmold.service.request.budget.fitting.fitted_layout)",
            param="budget",
        )
    if calls.tool_format.control_tokens:
        raise RequestError(
            f"budget 'fit' with tools needs a tool-call format written in text ({calls.tool_format.name} uses "
            "control tokens)",
            param="budget",
        )
    if calls.answer is not None and any(first_byte_kinds(begin[0]) or begin[:1].isspace() for begin in begins):
        raise RequestError(
            f"budget 'fit' with tools and a response_format needs calls that cannot begin like a JSON answer "
            f"({calls.tool_format.name} calls begin with {syntax.call_begin[:1]!r})",
            param="budget",
        )
    layout = CallLayout(
        begins=begins,
        end=syntax.call_end.encode(),
        separator=syntax.separator.encode(),
        section_begin=syntax.section_begin.encode(),
        section_end=syntax.section_end.encode(),
        parallel=calls.parallel,
        trigger=syntax.trigger.encode() if not calls.required and calls.answer is None else b"",
        answer=calls.answer is not None,
        arguments=calls.arguments_layout,
    )
    return layout.to_json([tool.parameters for tool in calls.tools], calls.answer)


def _trim(cache: OrderedDict[Any, Any]) -> None:
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
