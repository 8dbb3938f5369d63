"""MaskBench: do an engine's masks admit every valid instance and refuse invalid ones, and how fast?

For each schema: compile and fill the first mask (time to first mask, ``ttfm``). For each test
instance: serialize it as compact JSON, tokenize it (no special tokens) and walk its tokens; before
each one the next-token bitmask is filled (timed: ``tbm``) and must allow the token, which is then
committed. An instance is accepted by the mask when every token passes and a stop token is allowed
at the end. For tokenmold the validation layer then judges the text too (``*_final``); the raw
engines have no such layer, so their final verdict is the mask's. A rejected valid instance is
walked once more with its keys in the schema's property order (``benchmarks/reorder.py``): when
that passes, the rejection is counted as property order (``valid_rejected_order``), the layout every
engine here imposes, rather than as a value the grammar cannot produce. Failing that, it is walked
without the keys a closed-by-default layout never writes (tokenmold's and xgrammar's: an object
whose schema is silent about other keys gets only those it lists): when that passes, the rejection
is counted as closed objects (``valid_rejected_closed``).

With ``--rewalks N`` each instance is walked N more times, each through a fresh matcher of the
same compiled grammar, and each position's fastest fill among those is reported apart
(``rewalked``): the first walk is the first time each parser and lexer state of the schema is met
(what the first request for a schema meets), the rewalks read the same masks once the engine's
caches hold them and the host's one-sided noise is filtered out. The main figures are always the
first walk's.

    python -m benchmarks masks PATH... [--engines a,b] [--limit N] [--seed S] [--timeout S]
                                       [--jobs N] [--tokenizer DIR] [--rewalks N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.bitmasks import is_allowed, new_bitmask
from benchmarks.corpus import Instance, load_case, source_of
from benchmarks.engines import BenchEngine, compile_timed, first_objection
from benchmarks.reorder import in_closed_layout, in_schema_order
from benchmarks.report import MAX_EXAMPLES, CompileStats, common_compile, number, ratio, table
from benchmarks.runner import Outcome, add_common_arguments, run_benchmark
from tokenmold.grammar.backends.base import CompiledGrammar
from tokenmold.service.bench.stats import percentiles


@dataclass(frozen=True)
class InstanceResult:
    """One test instance walked through one engine's masks."""

    index: int
    valid: bool
    tokens: int
    accepted_by_mask: bool
    #: The mask's verdict after the validation layer (equal to it for engines without one).
    accepted_final: bool
    #: Position of the first token the mask refused, if any.
    rejected_at: int | None
    tbm_us: list[float]
    #: The mask and the matcher disagreed (a token allowed but not committed, or the stop token
    #: allowed while the matcher says incomplete, or the reverse).
    mismatch: str | None = None
    #: The validation layer raised instead of judging.
    validator_error: str | None = None
    #: A rejected valid instance that the mask accepts once its keys follow the schema's order.
    order_only: bool = False
    #: A rejected valid instance that the mask accepts without the keys its schema does not list
    #: in objects that are silent about other keys (and in schema order).
    closed_only: bool = False
    #: An invalid instance the mask accepted (a leak): the keyword of the validation layer's first
    #: objection to it, for every engine (the raw engines have no such layer; this only sorts).
    leak_keyword: str | None = None
    #: Per position of the first walk, the fastest fill among the rewalks (none without them).
    rewalked_us: list[float] = field(default_factory=list)


def measure_file(engine: BenchEngine, path: str, rewalks: int = 0) -> Iterator[Any]:
    """The job run in each engine's worker: a ``CompileResult``, then one ``InstanceResult`` per
    test (walked ``1 + rewalks`` times)."""
    case = load_case(path)
    bitmask = new_bitmask(engine.vocab)
    result, compiled = compile_timed(engine, case.schema, bitmask)
    yield result
    if compiled is None:
        return
    for index, instance in enumerate(case.tests):
        yield _measure_instance(engine, compiled, case.schema, index, instance, bitmask, rewalks)


def _measure_instance(
    engine: BenchEngine,
    compiled: CompiledGrammar,
    schema: dict[str, Any] | bool,
    index: int,
    instance: Instance,
    bitmask: torch.Tensor,
    rewalks: int = 0,
) -> InstanceResult:
    text = _compact(instance.data)
    tokens = engine.vocab.encode(text)
    times: list[float] = []
    accepted, rejected_at, mismatch = _walk(engine, compiled, tokens, bitmask, times)
    rewalked: list[float] = []
    for _ in range(rewalks):  # the same tokens, so the same positions
        again: list[float] = []
        _walk(engine, compiled, tokens, bitmask, again)
        rewalked = again if not rewalked else [min(a, b) for a, b in zip(rewalked, again, strict=True)]
    final, validator_error, order_only, closed_only, leak_keyword = accepted, None, False, False, None
    if accepted:
        try:
            verdict = engine.final_accepts(schema, text)
        except Exception as exc:  # a schema the validator cannot handle: counted, not accepted
            verdict, validator_error = False, f"{type(exc).__name__}: {exc}"[:300]
        final = accepted if verdict is None else verdict
        if not instance.valid:
            leak_keyword = _first_objection(schema, text)
    elif instance.valid:
        reordered = _compact(in_schema_order(instance.data, schema))
        order_only = reordered != text and _walk(engine, compiled, engine.vocab.encode(reordered), bitmask, [])[0]
        closed = _compact(in_closed_layout(instance.data, schema))
        closed_only = (
            not order_only
            and closed != reordered
            and _walk(engine, compiled, engine.vocab.encode(closed), bitmask, [])[0]
        )
    return InstanceResult(
        index,
        instance.valid,
        len(tokens),
        accepted,
        final,
        rejected_at,
        times,
        mismatch,
        validator_error,
        order_only,
        closed_only,
        leak_keyword,
        rewalked,
    )


def _first_objection(schema: dict[str, Any] | bool, text: str) -> str:
    """The keyword of the validation layer's first objection to ``text`` (``?`` if it has none or
    cannot judge the schema): which keyword a leaking mask let through."""
    try:
        objection = first_objection(schema, text)
    except Exception:  # the validator cannot handle this schema
        return "?"
    return objection.keyword if objection is not None else "?"


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _walk(
    engine: BenchEngine, compiled: CompiledGrammar, tokens: list[int], bitmask: torch.Tensor, times: list[float]
) -> tuple[bool, int | None, str | None]:
    """Walk ``tokens`` through a fresh matcher, timing each mask fill into ``times``: whether the
    mask accepted them with a stop allowed at the end, where it refused, and any disagreement
    between mask and matcher."""
    matcher = compiled.matcher()

    def fill() -> None:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        times.append((time.perf_counter() - started) * 1e6)

    for position, token in enumerate(tokens):
        fill()
        if not is_allowed(bitmask, token):
            return False, position, None
        if not matcher.accept_token(token):
            return False, position, f"token {position} allowed by the mask, refused: {matcher.error}"
    fill()
    stop_allowed = any(is_allowed(bitmask, stop) for stop in engine.vocab.stop_token_ids)
    mismatch = None
    if stop_allowed != matcher.is_accepting():
        mismatch = f"stop allowed by the mask: {stop_allowed}, matcher accepting: {matcher.is_accepting()}"
    return stop_allowed, None if stop_allowed else len(tokens), mismatch


_SOURCE_FIELDS = (
    "schemas",
    "compiled",
    "timeouts",
    "valid_tests",
    "valid_rejected",
    "valid_rejected_order",
    "valid_rejected_closed",
    "valid_rejected_final",
    "invalid_tests",
    "invalid_accepted_by_mask",
    "invalid_accepted_final",
)


#: A mask fill slower than this counts as slow: the p99 target a mask is held to (docs/benchmarks.md).
SLOW_MASK_US = 50.0
#: Files listed by their count of slow masks in the JSON.
SLOW_FILES_KEPT = 25


@dataclass
class MaskStats:
    """One engine's results over all files."""

    compile: CompileStats = field(default_factory=CompileStats)
    valid_tests: int = 0
    valid_rejected: int = 0
    #: Of ``valid_rejected``: accepted once the instance's keys follow the schema's property order.
    valid_rejected_order: int = 0
    #: Of ``valid_rejected``: accepted without the keys a closed-by-default layout never writes.
    valid_rejected_closed: int = 0
    valid_rejected_final: int = 0
    invalid_tests: int = 0
    invalid_accepted_by_mask: int = 0
    #: Of ``invalid_accepted_by_mask``: by the keyword the mask let through.
    leaks_by_keyword: Counter[str] = field(default_factory=Counter)
    invalid_accepted_final: int = 0
    mismatches: int = 0
    validator_errors: int = 0
    tbm_us: array[float] = field(default_factory=lambda: array("d"))
    #: Each position's fastest fill among the rewalks (``--rewalks``), and how many were over
    #: ``SLOW_MASK_US``.
    rewalked_us: array[float] = field(default_factory=lambda: array("d"))
    rewalked_slow: int = 0
    #: Where the largest single mask fill was measured.
    slowest_mask: dict[str, Any] = field(default_factory=dict)
    #: Per file, the mask fills over ``SLOW_MASK_US`` (where the tail sits; the JSON keeps the top).
    slow_masks: Counter[str] = field(default_factory=Counter)
    by_source: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    examples: defaultdict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, outcome: Outcome) -> None:
        name = Path(outcome.path).name
        source = self.by_source[source_of(name)]
        source["schemas"] += 1
        if not outcome.events:
            source["timeouts"] += outcome.timed_out
        if not self.compile.add(outcome):
            return
        source["compiled"] += 1
        for result in outcome.events[1:]:
            self._add_instance(name, source, result)

    def _add_instance(self, name: str, source: Counter[str], result: InstanceResult) -> None:
        self.tbm_us.extend(result.tbm_us)
        self.rewalked_us.extend(result.rewalked_us)
        self.rewalked_slow += sum(t > SLOW_MASK_US for t in result.rewalked_us)
        slow = sum(t > SLOW_MASK_US for t in result.tbm_us)
        if slow:
            self.slow_masks[name] += slow
        where = {"file": name, "test": result.index, "tokens": result.tokens, "rejected_at": result.rejected_at}
        if result.tbm_us and max(result.tbm_us) > self.slowest_mask.get("tbm_us", -1.0):
            slowest = max(range(len(result.tbm_us)), key=result.tbm_us.__getitem__)
            self.slowest_mask = {
                "file": name,
                "test": result.index,
                "token": slowest,
                "tbm_us": round(result.tbm_us[slowest], 1),
            }
        if result.mismatch:
            self.mismatches += 1
            self._example("mismatch", {**where, "detail": result.mismatch})
        if result.validator_error:
            self.validator_errors += 1
            self._example("validator_error", {**where, "detail": result.validator_error})
        if result.valid:
            self.valid_tests += 1
            source["valid_tests"] += 1
            if not result.accepted_by_mask:
                self.valid_rejected += 1
                source["valid_rejected"] += 1
                kind = "valid_rejected"
                if result.order_only:
                    kind = "valid_rejected_order"
                    self.valid_rejected_order += 1
                    source[kind] += 1
                elif result.closed_only:
                    kind = "valid_rejected_closed"
                    self.valid_rejected_closed += 1
                    source[kind] += 1
                self._example(kind, where)
            if not result.accepted_final:
                self.valid_rejected_final += 1
                source["valid_rejected_final"] += 1
        else:
            self.invalid_tests += 1
            source["invalid_tests"] += 1
            if result.accepted_by_mask:
                self.invalid_accepted_by_mask += 1
                self.leaks_by_keyword[result.leak_keyword or "?"] += 1
                source["invalid_accepted_by_mask"] += 1
                self._example(f"leak:{result.leak_keyword}", where)
            if result.accepted_final:
                self.invalid_accepted_final += 1
                source["invalid_accepted_final"] += 1
                self._example("invalid_accepted_final", where)

    def _example(self, kind: str, example: dict[str, Any]) -> None:
        if len(self.examples[kind]) < MAX_EXAMPLES:
            self.examples[kind].append(example)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.compile.as_dict(),
            "valid_tests": self.valid_tests,
            "valid_rejected": self.valid_rejected,
            "valid_rejected_order": self.valid_rejected_order,
            "valid_rejected_closed": self.valid_rejected_closed,
            "valid_rejected_final": self.valid_rejected_final,
            "invalid_tests": self.invalid_tests,
            "invalid_accepted_by_mask": self.invalid_accepted_by_mask,
            "leaks_by_keyword": dict(self.leaks_by_keyword.most_common()),
            "invalid_accepted_final": self.invalid_accepted_final,
            "mismatches": self.mismatches,
            "validator_errors": self.validator_errors,
            "tbm_us": percentiles(self.tbm_us),
            "masks_timed": len(self.tbm_us),
            "slowest_mask": self.slowest_mask,
            "slow_masks": sum(self.slow_masks.values()),
            "slow_masks_by_file": dict(self.slow_masks.most_common(SLOW_FILES_KEPT)),
            "by_source": {s: {f: c[f] for f in _SOURCE_FIELDS} for s, c in sorted(self.by_source.items())},
            "examples": dict(self.examples),
            **(
                {
                    "rewalked": {
                        "tbm_us": percentiles(self.rewalked_us),
                        "masks_timed": len(self.rewalked_us),
                        "slow_masks": self.rewalked_slow,
                    }
                }
                if self.rewalked_us
                else {}
            ),
        }


def render(stats: dict[str, MaskStats]) -> str:
    headers = [
        "engine",
        "compiles",
        "valid rejected",
        "of which order",
        "of which closed objects",
        "of which neither",
        "invalid acc. (mask)",
        "invalid acc. (final)",
        "compile p50/p99 ms",
        "mask p50/p99 µs",
        f"masks > {SLOW_MASK_US:g} µs",
        "timeouts",
    ]
    rewalked = any(s.rewalked_us for s in stats.values())
    if rewalked:
        headers.insert(-1, "rewalked mask p50/p99 µs (> 50)")
    rows = []
    for engine, s in stats.items():
        ttfm, tbm = percentiles(s.compile.ttfm_ms), percentiles(s.tbm_us)
        other = s.valid_rejected - s.valid_rejected_order - s.valid_rejected_closed
        rows.append(
            [
                engine,
                s.compile.compiles_cell(),
                f"{ratio(s.valid_rejected, s.valid_tests)} ({s.valid_rejected}/{s.valid_tests})",
                f"{s.valid_rejected_order} ({ratio(s.valid_rejected_order, s.valid_tests)})",
                f"{s.valid_rejected_closed} ({ratio(s.valid_rejected_closed, s.valid_tests)})",
                f"{other} ({ratio(other, s.valid_tests)})",
                f"{s.invalid_accepted_by_mask}/{s.invalid_tests} "
                f"({ratio(s.invalid_accepted_by_mask, s.invalid_tests)})",
                f"{s.invalid_accepted_final}/{s.invalid_tests} ({ratio(s.invalid_accepted_final, s.invalid_tests)})",
                f"{number(ttfm['p50'])} / {number(ttfm['p99'])}",
                f"{number(tbm['p50'])} / {number(tbm['p99'])}",
                f"{sum(s.slow_masks.values())} ({ratio(sum(s.slow_masks.values()), len(s.tbm_us))})",
                str(s.compile.all_timeouts),
            ]
        )
        if rewalked:
            again = percentiles(s.rewalked_us)
            rows[-1].insert(-1, f"{number(again['p50'])} / {number(again['p99'])} ({s.rewalked_slow})")
    rendered = table(headers, rows)
    if len(stats) > 1:
        rendered += "\n\n" + common_compile({engine: s.compile for engine, s in stats.items()})
    return rendered


def run_masks(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks masks", description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument(
        "--rewalks",
        type=int,
        default=0,
        metavar="N",
        help="walk each instance N more times through fresh matchers and report each position's "
        "fastest fill apart (default 0: the first walk only)",
    )
    return run_benchmark(
        parser, argv, job=lambda args: partial(measure_file, rewalks=args.rewalks), new_stats=MaskStats, render=render
    )
