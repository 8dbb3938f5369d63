"""Budget-fitting walk: random answers under ``budget: "fit"`` must close, valid, within the budget.

For each MaskBench schema that compiles with llguidance (as fitting needs) and whose keywords the
grammar enforces all (a keyword left to validation lets the grammar itself write invalid text,
which is the soundness walk's to count, ``benchmarks/walk.py``): random budgets between the
shortest output's tokens and its end-of-sequence token (the floor the service refuses below) and
twice the natural length (the tokens of the longest valid test instance as compact JSON, or the
floor if none), and for each one walk: at every step the grammar's row (llguidance and the guards,
as the service fills it), narrowed by the budget fitter, and a token drawn uniformly among those
left (``benchmarks.bitmasks.random_walk``: no model, the most wasteful writer there is). A
walk must draw the end-of-sequence token within the budget, and its text must pass the validation
layer. A shape fitting refuses up front (``tokenmold.grammar.budget.coverage``) is counted as refused,
not walked. A failure prints the schema file, the budget, the token path and the first step at
which the plan no longer fitted. A walk that closed in time with a plan that fitted at every step
but whose text the validator refuses is counted apart: the grammar admitted that text (a number
beyond a double, a leap second llguidance's ``time`` takes), which ``benchmarks/walk.py`` measures.

    python -m benchmarks fit PATH... [--limit N] [--budgets K] [--seed S] [--schema-seconds T] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bitmasks import new_bitmask, random_walk
from benchmarks.corpus import BenchCase, expand_paths, load_case, sample
from benchmarks.engines import default_tokenizer_dir, first_objection, load_vocabulary
from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler, ShapeError, Vocabulary
from tokenmold.grammar.budget.coverage import first_gap
from tokenmold.grammar.budget.fitter import Fitter, Fitting, TokenTable
from tokenmold.grammar.budget.floor import fewest_tokens


@dataclass
class FitWalkStats:
    """What the walk saw: schemas by outcome, pairs walked, and the failures."""

    schemas: Counter[str] = field(default_factory=Counter)
    pairs: int = 0
    failures: list[str] = field(default_factory=list)
    #: Walks that closed in time, with a plan that fitted at every step, whose text the validator
    #: refuses all the same: the grammar admits it (a number beyond a double, a leap second).
    grammar_invalid: int = 0


class FitWalker:
    """Compiles each schema as the service does and walks it under random budgets."""

    def __init__(self, vocab: Vocabulary, schema_seconds: float = 60.0) -> None:
        self.vocab = vocab
        #: Past this many seconds on one schema its remaining budgets are not walked.
        self.schema_seconds = schema_seconds
        self.table = TokenTable.from_llguidance(vocab.llguidance_tokenizer)
        self.compiler = ShapeCompiler(vocab, isolation="inline", cache_bytes=0)
        self.bitmask = new_bitmask(vocab)

    def walk_case(self, case: BenchCase, budgets: int, rng: random.Random, stats: FitWalkStats) -> None:
        try:
            compiled = self.compiler.compile(Shape.from_json_schema(case.schema), CompileOptions())
        except ShapeError:
            stats.schemas["not compiled"] += 1
            return
        schema, floor, grammar = compiled.normalized_schema, compiled.output_floor, compiled.token_grammar
        if compiled.engine_spec.backend != "llguidance" or schema is None or floor is None or grammar is None:
            stats.schemas["not llguidance"] += 1
            return
        if compiled.report.validated_only:
            stats.schemas["keywords left to validation"] += 1
            return
        if first_gap(schema) is not None:
            stats.schemas["refused"] += 1
            return
        stats.schemas["walked"] += 1
        fitting = Fitting(schema, self.table)
        lowest = floor.fitted_tokens + 1  # and the end-of-sequence token
        natural = max((self.natural(t.data) for t in case.tests if t.valid), default=lowest)
        started = time.monotonic()
        for _ in range(budgets):
            if time.monotonic() - started > self.schema_seconds:
                stats.schemas["budgets cut short (slow)"] += 1
                break
            budget = rng.randint(lowest, max(lowest, 2 * natural))
            fitter = Fitter(fitting, budget)
            walk = random_walk(self.vocab, grammar, self.bitmask, rng, budget, restriction=fitter)
            stats.pairs += 1
            error = walk.error if walk.outcome != "completed" else None
            if walk.outcome == "completed":
                objection = first_objection(case.schema, walk.text)
                error = None if objection is None else f"{objection.path or '/'}: {objection.message}"
            overrun = _overrun(fitting, budget, walk.path)
            if walk.outcome == "completed" and error is not None and overrun is None:
                stats.grammar_invalid += 1  # the grammar wrote it within a plan that fitted: not fitting's
                continue
            if walk.outcome != "completed" or error is not None:
                stats.failures.append(
                    f"{case.name} budget={budget} {walk.outcome} {error or ''}\n  text: {walk.text[:300]!r}\n"
                    f"  tokens: {list(walk.path)}\n  {overrun or 'the plan fitted at every step'}"
                )

    def natural(self, value: object) -> int:
        import json

        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return fewest_tokens(text.encode(), self.table) if len(text) > 4000 else len(self.vocab.encode(text))


def _overrun(fitting: Fitting, budget: int, path: tuple[int, ...]) -> str | None:
    """The first step of ``path`` after which the plan no longer fits the tokens left (what the
    planner got wrong just before it), replayed."""
    fitter = Fitter(fitting, budget)
    before = None
    for step, token in enumerate(path):
        plan = fitter.tracker.plan()
        cost = None if plan is None else fitting.cost(plan)
        if plan is None or cost is None or cost > fitter.left - 1:
            return f"overrun at step {step}: cost {cost}, {fitter.left} left, plan {plan!r:.200}; before: {before}"
        before = (cost, fitting.table.by_id[token], plan[:200])
        fitter.accept(token)
    return None


def run_fit_walk(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="MaskBench files, or folders of them")
    parser.add_argument("--limit", type=int, default=None, help="a seeded sample of N files covering every source")
    parser.add_argument("--budgets", type=int, default=3, help="random budgets walked per schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schema-seconds", type=float, default=60.0, help="walk no more budgets of a slower schema")
    parser.add_argument("--tokenizer", metavar="DIR", default=None, help="default: the embedded model's")
    args = parser.parse_args(argv)
    files = sample(expand_paths(args.paths), args.limit, args.seed)
    walker = FitWalker(load_vocabulary(args.tokenizer or default_tokenizer_dir()), args.schema_seconds)
    stats = FitWalkStats()
    started = time.monotonic()
    for path in files:
        case = load_case(path)
        walker.walk_case(case, args.budgets, random.Random(f"{args.seed}:{Path(path).name}"), stats)
    for failure in stats.failures:
        print(failure)
    schemas = ", ".join(f"{n} {what}" for what, n in sorted(stats.schemas.items()))
    print(f"schemas: {schemas}")
    print(
        f"pairs walked: {stats.pairs}, failures: {len(stats.failures)}, "
        f"closed in time but invalid by the grammar's own leave: {stats.grammar_invalid} "
        f"({time.monotonic() - started:.0f} s)"
    )
    return 1 if stats.failures else 0
