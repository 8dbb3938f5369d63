"""``tokenmold bench drafts``: forced-token drafts (``serve --forced-drafts``) against the mask alone.

Greedy, batch 1 by default: each request alone on the engine, as an agent's next tool call is
(``--batch B`` sends B copies of each request at once instead). Two workloads:
tool calls through the chat path (three functions, ``tool_choice: required``, the model picks one
and writes its arguments) and the extraction tasks of ``bench budget`` (pydantic-style schemas).
Each runs on an engine without drafts and on one drafting up to ``--draft-tokens`` forced tokens,
one engine after the other; the figure per workload is the median tokens/s of ``--repeats`` runs.
The report says which share of the decoded tokens the grammar forced (after the prefix
jump-forward already takes as prompt): the drafts can only speed up those. It also counts the
answers identical token for token to the undrafted engine's and the accepted verdicts of both:
verification checks several positions in one forward pass, whose 16-bit logits are not
bit-identical to one position per pass, so a greedy answer may part at a near tie (the sampling
distribution is the same; the answer stays grammatical and is judged like any other). ``drafted``
counts the requests with an llguidance grammar (only those get drafts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmold.grammar import CompileOptions, Shape
from tokenmold.grammar.backends.base import LlguidanceSpec
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.schemas.verdict import VerdictStatus
from tokenmold.service.bench.extraction_tasks import TASKS
from tokenmold.service.engine.async_engine import EngineConfig
from tokenmold.service.request.runtime import Prompt, Runtime, RuntimeConfig

_WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
_FLIGHT = {
    "type": "object",
    "properties": {
        "origin": {"type": "string"},
        "destination": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]},
    },
    "required": ["origin", "destination", "date", "passengers", "cabin"],
}
_EMAIL = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "format": "email"},
        "subject": {"type": "string"},
        "body": {"type": "string"},
    },
    "required": ["to", "subject", "body"],
}
TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
    for n, d, p in (
        ("get_weather", "Current weather in a city", _WEATHER),
        ("book_flight", "Book a flight for passengers on a date", _FLIGHT),
        ("send_email", "Send an email", _EMAIL),
    )
]
GREEDY = SamplingOptions(max_tokens=400, temperature=0.0)
TOOL_PROMPTS = (
    "What is the weather in Paris right now, in celsius?",
    "Book a flight from Boston to Denver on 2026-12-24 for 2 passengers in business class.",
    "Email alice@example.com that the design review moved to Friday at 10.",
)


@dataclass(frozen=True)
class Request:
    """One request of a workload, as the runtime takes it."""

    prompt: Prompt
    shape: Shape
    sampling: SamplingOptions
    options: CompileOptions


@dataclass
class Answer:
    token_ids: list[int]
    accepted: bool
    forced: int
    jumped: int
    drafted: bool


@dataclass
class Workload:
    name: str
    requests: list[Request]
    runs: dict[str, list[float]] = field(default_factory=dict)
    answers: dict[str, list[Answer]] = field(default_factory=dict)


def _workloads(runtime: Runtime) -> list[Workload]:
    from tokenmold.schemas.openai import ChatCompletionRequest
    from tokenmold.service.api.translate import chat_plan

    tools = []
    for text in TOOL_PROMPTS:
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "tools": TOOLS}
        plan = chat_plan(ChatCompletionRequest.model_validate(body | {"tool_choice": "required"}), runtime.model)
        assert plan.shape is not None
        sampling = plan.sampling.model_copy(update={"temperature": 0.0, "max_tokens": 200})
        tools.append(Request(plan.prompt, plan.shape, sampling, plan.options))
    extraction = [
        Request(Prompt.user(t.prompt), Shape.from_json_schema(t.schema), GREEDY, CompileOptions()) for t in TASKS
    ]
    return [Workload("tool-call", tools), Workload("extraction", extraction)]


async def _answer(runtime: Runtime, request: Request) -> Answer:
    """One greedy answer, and how many of its tokens its grammar forced (see the module docstring)."""
    import llguidance

    result = await runtime.generate(request.prompt, request.shape, request.sampling, request.options)
    tokens = result.completions[0].token_ids
    accepted = result.completions[0].verdict.status is VerdictStatus.ACCEPTED
    compiled = await runtime.compile(request.shape, request.options)
    spec = LlguidanceSpec.read(compiled.engine_spec.text)
    if spec is None:
        return Answer(tokens, accepted, 0, 0, False)
    matcher = llguidance.LLMatcher(runtime.compiler.vocab.llguidance_tokenizer, spec.grammar, log_level=0)
    jumped = forced = 0
    for i, token in enumerate(tokens):
        ff = matcher.compute_ff_tokens()
        if ff and ff[0] == token:
            if i == jumped:
                jumped += 1  # still the prefix jump-forward takes as prompt
            else:
                forced += 1
        if not matcher.consume_token(token):
            break
    return Answer(tokens, accepted, forced, jumped, True)


async def _measure(drafts: int, repeats: int, batch: int, model: str | None) -> list[Workload]:
    runtime = Runtime(RuntimeConfig(engine=EngineConfig(model=model, forced_drafts=drafts)))
    runtime.start_engine()
    mode = "drafts" if drafts else "mask"
    try:
        workloads = _workloads(runtime)
        for workload in workloads:
            for request in workload.requests:  # compiled, engine warm
                await _answer(runtime, request)
            for _ in range(repeats):
                started = time.perf_counter()
                answers = []
                for request in workload.requests:
                    answers += await asyncio.gather(*(_answer(runtime, request) for _ in range(batch)))
                tokens = sum(len(a.token_ids) for a in answers)
                workload.runs.setdefault(mode, []).append(tokens / (time.perf_counter() - started))
                workload.answers[mode] = answers
        return workloads
    finally:
        runtime.shutdown()


def _figures(mask: Workload, drafts: Workload) -> dict[str, Any]:
    answers, others = mask.answers["mask"], drafts.answers["drafts"]
    decoded = sum(len(a.token_ids) - a.jumped for a in answers)
    forced = sum(a.forced for a in answers)
    plain, drafted = statistics.median(mask.runs["mask"]), statistics.median(drafts.runs["drafts"])
    return {
        "workload": mask.name,
        "requests": len(answers),
        "requests_drafted": sum(a.drafted for a in answers),
        "tokens": sum(len(a.token_ids) for a in answers),
        "forced_share": round(forced / decoded, 3) if decoded else 0.0,
        "mask_tok_s": round(plain, 1),
        "drafts_tok_s": round(drafted, 1),
        "speedup": round(drafted / plain, 3) if plain else 0.0,
        "identical_answers": sum(a.token_ids == b.token_ids for a, b in zip(answers, others, strict=True)),
        "accepted": {"mask": sum(a.accepted for a in answers), "drafts": sum(a.accepted for a in others)},
        "runs": {"mask": _rounded(mask.runs["mask"]), "drafts": _rounded(drafts.runs["drafts"])},
    }


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


def run_drafts(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmold bench drafts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft-tokens", type=int, default=4, help="forced tokens drafted per step")
    parser.add_argument("--repeats", type=int, default=3, help="runs per workload and engine (median)")
    parser.add_argument("--batch", type=int, default=1, help="copies of each request sent at once")
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    plain = asyncio.run(_measure(0, args.repeats, args.batch, args.model))
    drafted = asyncio.run(_measure(args.draft_tokens, args.repeats, args.batch, args.model))
    rows = [_figures(m, d) for m, d in zip(plain, drafted, strict=True)]
    print(
        f"{'workload':>10} {'drafted':>8} {'forced':>7} {'mask tok/s':>10} {'drafts tok/s':>12} {'speedup':>8} "
        "identical accepted (mask/drafts)"
    )
    for r in rows:
        n, accepted = r["requests"], r["accepted"]
        print(
            f"{r['workload']:>10} {r['requests_drafted']:>4}/{n:<3} {r['forced_share']:>7.1%} "
            f"{r['mask_tok_s']:>10} {r['drafts_tok_s']:>12} {r['speedup']:>7}x {r['identical_answers']:>5}/{n:<3} "
            f"{accepted['mask']}/{accepted['drafts']}"
        )
    if args.json:
        report = {"draft_tokens": args.draft_tokens, "repeats": args.repeats, "batch": args.batch, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_drafts())
