"""Budget fitting without the engine: the tracker's shortest completions, and random walks through
llguidance's real mask on the real vocabulary, where a fitted walk always ends as schema-valid JSON
within its budget (the control: the same walks unfitted end truncated). The engine's run is
tests/engine/test_fit_engine.py."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import jsonschema
import pytest
import torch

from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler
from tokenmold.grammar.backends.base import EngineSpec, FitRequest, LlguidanceSpec
from tokenmold.grammar.bitmask_rows import allowed_tokens
from tokenmold.grammar.budget.fitter import Fitter, Fitting, TokenTable
from tokenmold.grammar.budget.replay import FitOutcome, replay
from tokenmold.grammar.budget.schema import FitSchema
from tokenmold.grammar.budget.tracker import Tracker
from tokenmold.grammar.json_layout import ARGUMENTS
from tokenmold.service.request.repetition import RepetitionGuard

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "email": {"type": "string", "minLength": 5},
        "kind": {"enum": ["staff", "visitor"]},
    },
    "required": ["name", "tags", "kind"],
}
NESTED = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}, "note": {"type": "string"}},
                "required": ["sku", "qty"],
            },
        },
        "total": {"type": "number"},
        "phone": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["items", "total"],
}
OPEN = {
    "type": "object",
    "properties": {"id": {"type": "integer"}},
    "required": ["id"],
    "additionalProperties": {"type": "string"},
}


def _plan(schema: dict, written: str) -> str | None:
    plan = Tracker(FitSchema(schema)).feed(written.encode()).plan()
    return plan.decode() if plan is not None else None


@pytest.mark.parametrize(
    ("written", "plan"),
    [
        ("", '{"name":"","tags":[""],"kind":"staff"}'),
        ('{"na', 'me":"","tags":[""],"kind":"staff"}'),
        ('{"name":"Ada', '","tags":[""],"kind":"staff"}'),
        ('{"name":"Ada","age":4', ',"tags":[""],"kind":"staff"}'),
        ('{"name":"Ada","age":-', '0,"tags":[""],"kind":"staff"}'),
        ('{"name":"Ada","tags":[', '""],"kind":"staff"}'),
        ('{"name":"Ada","tags":["x"', '],"kind":"staff"}'),
        ('{"name":"Ada","tags":["x"],"email":"ab', 'aaa","kind":"staff"}'),
        ('{"name":"Ada","tags":["x"],"kind":"vi', 'sitor"}'),
        ('{"name":"Ada","tags":["x"],"kind":"visitor"}', ""),
        ('{"name":"A\\', 'n","tags":[""],"kind":"staff"}'),
    ],
)
def test_the_plan_is_the_shortest_valid_completion(written: str, plan: str) -> None:
    assert _plan(PERSON, written) == plan
    jsonschema.validate(json.loads(written + plan), PERSON)


def test_plans_follow_anyof_branches_and_nested_required_members() -> None:
    assert _plan(NESTED, '{"items":[{"sku":"a"') == ',"qty":0}],"total":0}'
    assert _plan(NESTED, '{"items":[],"total":1.') == "0}"
    assert _plan(NESTED, '{"items":[],"total":1,"phone":n') == "ull}"
    assert _plan(NESTED, '{"items":[],"total":1,"phone":"') == '"}'


def test_an_open_utf8_sequence_is_completed_before_the_string_closes() -> None:
    tracker = Tracker(FitSchema(PERSON)).feed('{"name":"é'.encode()[:-1])
    assert tracker.plan().startswith(b'\x80"')  # é is C3 A9: the cheapest completion is C3 80


def test_an_open_object_key_closes_as_an_extra_key_or_a_listed_one() -> None:
    assert _plan(OPEN, '{"i') == 'd":0}'
    assert _plan(OPEN, '{"id":1,"x') == '":""}'
    # The grammar writes listed members in their order and extra keys after them.
    assert _plan(OPEN, '{"x') is None
    assert _plan(PERSON, '{"name":"A","tags":[],"a') is None  # age comes before tags


def test_a_byte_the_schema_cannot_hold_loses_the_tracker() -> None:
    assert Tracker(FitSchema(PERSON)).feed(b'{"name":1').lost
    assert _plan({**PERSON, "additionalProperties": False}, '{"zzz":') is None


def test_the_spec_line_round_trips() -> None:
    fit = FitRequest(40, json.dumps(PERSON), (8, 16, 32))
    spec = LlguidanceSpec("GRAMMAR", forced=(1, 2), unique_keys=True, fit=fit)
    assert LlguidanceSpec.read(spec.text) == spec
    plain = EngineSpec("grammar", LlguidanceSpec("G").text, "llguidance")
    assert plain.with_fit(FitRequest(3, "{}")).llguidance == LlguidanceSpec("G", fit=FitRequest(3, "{}"))


@pytest.fixture(scope="module")
def table(vocab) -> TokenTable:
    return TokenTable.from_llguidance(vocab.llguidance_tokenizer)


def _compiled(vocab, schema: dict):
    return ShapeCompiler(vocab, isolation="inline").compile(Shape.from_json_schema(schema), CompileOptions())


def _walk(compiled, fitting: Fitting | None, budget: int, seed: int, fitter_kwargs: dict | None = None):
    """Random tokens among those the mask allows (the model is replaced by a uniform choice, the
    most wasteful writer there is); returns the tokens and the fitter."""
    rng = random.Random(seed)
    eos = set(compiled.token_grammar._vocab.stop_token_ids)
    matcher = compiled.token_grammar.matcher()
    fitter = Fitter(fitting, budget, **(fitter_kwargs or {})) if fitting is not None else None
    size = fitting.table.size if fitting else compiled.token_grammar._vocab.vocab_size
    bitmask = torch.zeros((1, (size + 31) // 32), dtype=torch.int32)
    words = bitmask[0].numpy()
    tokens: list[int] = []
    for _ in range(budget):
        matcher.fill_next_token_bitmask(bitmask, 0)
        if fitter is not None:
            fitter.restrict(words)
        allowed = allowed_tokens(words, size).tolist()
        assert allowed, f"nothing allowed after {tokens}"
        token = rng.choice(allowed)
        tokens.append(token)
        if token in eos:
            break
        assert matcher.accept_token(token), matcher.error
        if fitter is not None:
            fitter.accept(token)
    return tokens, fitter


@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
def test_fitted_random_walks_end_schema_valid_within_their_budget(vocab, table, schema) -> None:
    compiled = _compiled(vocab, schema)
    fitting = Fitting(compiled.normalized_schema, table)
    floor = compiled.output_floor.fitted_tokens
    eos = set(vocab.stop_token_ids)
    for budget in (floor + 1, floor + 3, floor + 8, floor + 20):
        for seed in range(4):
            tokens, _ = _walk(compiled, fitting, budget, seed)
            assert tokens[-1] in eos, f"budget {budget} seed {seed}: no end of sequence in {len(tokens)} tokens"
            text = vocab.hf_tokenizer.decode(tokens[:-1])
            jsonschema.validate(json.loads(text), schema)


def test_unfitted_random_walks_run_out_of_budget(vocab, schema=PERSON) -> None:
    compiled = _compiled(vocab, schema)
    floor = compiled.output_floor.tokens
    ended = [_walk(compiled, None, floor + 3, seed)[0][-1] in vocab.stop_token_ids for seed in range(4)]
    assert not all(ended)


def test_the_replay_finds_the_steps_the_live_fitter_narrowed(vocab, table) -> None:
    compiled = _compiled(vocab, PERSON)
    fitting = Fitting(compiled.normalized_schema, table)
    budget = compiled.output_floor.fitted_tokens + 6
    tokens, live = _walk(compiled, fitting, budget, seed=7)
    outcome = replay(fitting, compiled.token_grammar.matcher(), budget=budget, forced=(), tokens=tokens)
    assert outcome.narrowed == tuple(live.narrowed) and outcome.changed
    value = json.loads(vocab.hf_tokenizer.decode(tokens[:-1]))
    cut = outcome.cut(value)
    assert cut and all(p.startswith("/") for p in cut)
    if "email" not in value:
        assert "/email" in cut


def test_a_loop_inside_a_value_makes_the_output_close(vocab, table) -> None:
    compiled = _compiled(vocab, PERSON)
    fitting = Fitting(compiled.normalized_schema, table)
    fitter = Fitter(fitting, 400, detector=RepetitionGuard().detector())
    for token in vocab.encode('{"name":"' + "john_" * 40):
        fitter.accept(token)
    assert fitter.looping_at == "/name"
    bitmask = torch.zeros((1, (table.size + 31) // 32), dtype=torch.int32)
    matcher = compiled.token_grammar.matcher()
    assert matcher.accept_text('{"name":"' + "john_" * 40)
    matcher.fill_next_token_bitmask(bitmask, 0)
    fitter.restrict(bitmask[0].numpy())
    allowed = allowed_tokens(bitmask[0].numpy(), table.size).tolist()
    assert allowed and all(b'"' in table.by_id[t] for t in allowed)  # only a closing quote may come


def test_fitted_random_walks_of_tool_calls_end_as_valid_calls(vocab, table) -> None:
    from tokenmold.grammar.tools import Tool
    from tokenmold.service.request.budget.fitting import _fit_target
    from tokenmold.service.validation.verdicts import check_tool_calls

    tools = [
        Tool("get_weather", PERSON),
        Tool("search", {"type": "object", "properties": {"q": {"type": "string", "minLength": 3}}, "required": ["q"]}),
    ]
    for parallel in (False, True):
        compiled = ShapeCompiler(vocab, isolation="inline").compile(
            Shape.from_tools(tools, required=True, parallel=parallel, arguments_layout=ARGUMENTS)
        )
        fitting = Fitting(_fit_target(compiled), table)
        for budget in (40, 60):
            for seed in range(4):
                tokens, fitter = _walk(compiled, fitting, budget, seed)
                assert tokens[-1] in vocab.stop_token_ids, (parallel, budget, seed)
                calls, errors = check_tool_calls(vocab.hf_tokenizer.decode(tokens[:-1]), compiled.normalized_calls)
                assert calls and not errors, errors
                pointers = [n.innermost for n in fitter.narrowed if n.innermost is not None]
                assert all(p.split("/")[2] == "arguments" for p in pointers), pointers


def test_the_outcome_lists_what_was_shortened_and_left_out() -> None:
    from tokenmold.grammar.budget.fitter import Narrowing

    outcome = FitOutcome((Narrowing(5, "/name", ("/tags",), (("", ("age", "email")),)),))
    assert outcome.cut({"name": "A", "age": 3, "tags": []}) == ["/email", "/name", "/tags"]
    assert not FitOutcome(()).changed


def test_an_error_in_the_engine_side_fitting_leaves_the_request_to_its_grammar(vocab, monkeypatch) -> None:
    """The plugin's path without the engine: a fitter that raises must not raise into vLLM's step
    (it would fail every request on the engine); the row stays the grammar's."""
    from types import SimpleNamespace

    from tokenmold.grammar.budget.fitter import Fitter as FitterClass
    from tokenmold.service.vllm_core.vllm_plugin import _compile_llguidance, _fit_budget

    compiled = _compiled(vocab, PERSON)
    spec = compiled.engine_spec.with_fit(FitRequest(40, json.dumps(compiled.normalized_schema)))
    parsed = spec.llguidance
    backend = SimpleNamespace(tokenizer=vocab.hf_tokenizer, vocab_size=vocab.vocab_size)
    plain = _compile_llguidance(backend, parsed.grammar)
    fitted = _compile_llguidance(backend, parsed.grammar)
    _fit_budget(backend, fitted, parsed)

    def broken(self, words):
        raise RuntimeError("injected")

    monkeypatch.setattr(FitterClass, "restrict", broken)
    rows = torch.zeros((2, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    plain.fill_bitmask(rows, 0)
    fitted.fill_bitmask(rows, 1)  # does not raise
    assert torch.equal(rows[0], rows[1])
    assert fitted.accept_tokens("r", vocab.encode('{"name":"A"'))


# ---------------------------------------------------------------- tool_choice auto

CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 2}}, "required": ["city"]}
REPLY = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def _auto(vocab, *, answer: dict | None = None, parallel: bool = True):
    from tokenmold.grammar.tools import Tool

    shape = Shape.from_tools([Tool("get_weather", CITY)], required=False, parallel=parallel, arguments_layout=ARGUMENTS)
    if answer is not None:
        shape = Shape(shape.kind, replace(shape.source, answer=answer))
    return ShapeCompiler(vocab, isolation="inline").compile(shape)


@pytest.mark.parametrize(
    ("written", "plan", "done"),
    [
        ("", "", True),
        ("Let me <tool", "", True),  # free text may end anywhere, a trigger begun or not
        ("Sure. <tool_call>", '\n{"name": "get_weather", "arguments": {"city": "aa"}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "P', 'a"}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city":', ' "aa"}}\n</tool_call>', False),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call> Done', "", True),
    ],
)
def test_free_text_ends_anywhere_and_a_call_begun_must_close(vocab, written: str, plan: str, done: bool) -> None:
    from tokenmold.service.request.budget.fitting import _fit_target

    compiled = _auto(vocab)
    tracker = Tracker(FitSchema(_fit_target(compiled))).feed(written.encode())
    assert tracker.plan() == plan.encode() and tracker.done is done
    assert compiled.accepts(written + plan)  # the plan is laid out as the grammar writes


def test_calls_or_a_json_answer_are_told_apart_by_their_first_byte(vocab) -> None:
    from tokenmold.service.request.budget.fitting import _fit_target

    compiled = _auto(vocab, answer=REPLY)
    schema = FitSchema(_fit_target(compiled))
    for written, plan in [
        ("", '{"answer":""}'),  # a JSON answer is compact, as without tools
        ('{"answer":"It', '"}'),
        ("<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "aa"}}\n</tool_call>'),
    ]:
        assert Tracker(schema).feed(written.encode()).plan() == plan.encode()
        assert compiled.accepts(written + plan)


def test_arguments_are_planned_in_the_layout_the_grammar_writes(vocab) -> None:
    """Tool-call arguments are laid out as ``json.dumps`` writes them: every plan, from any point
    between a separator's bytes, is what the grammar accepts after what was written."""
    from tokenmold.grammar.toolformats import HERMES
    from tokenmold.grammar.tools import Tool
    from tokenmold.service.request.budget.fitting import _fit_target

    compiled = ShapeCompiler(vocab, isolation="inline").compile(
        Shape.from_tools([Tool("add", NESTED)], required=True, parallel=True, arguments_layout=ARGUMENTS)
    )
    schema = FitSchema(_fit_target(compiled))
    call = HERMES.render_calls([("add", {"items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 0}], "total": 1})])
    for cut in range(len(call) + 1):
        plan = Tracker(schema).feed(call[:cut].encode()).plan()
        assert plan is not None and compiled.accepts(call[:cut] + plan.decode()), (call[:cut], plan)
    assert Tracker(schema).feed(b'<tool_call>\n{"name": "add", "arguments": {').plan() == (
        b'"items": [], "total": 0}}\n</tool_call>'
    )


def test_a_format_whose_calls_begin_like_json_cannot_fit_with_an_answer(vocab) -> None:
    from tokenmold.grammar.tools import Tool
    from tokenmold.service.errors import RequestError
    from tokenmold.service.request.budget.fitting import _fit_target
    from tokenmold.service.request.toolformats import FORMATS

    shape = Shape.from_tools(
        [Tool("f", CITY)], required=False, parallel=True, tool_format=FORMATS["llama3"], arguments_layout=ARGUMENTS
    )
    compiled = ShapeCompiler(vocab, isolation="inline").compile(Shape(shape.kind, replace(shape.source, answer=REPLY)))
    with pytest.raises(RequestError, match="cannot begin like a JSON answer"):
        _fit_target(compiled)


@pytest.mark.parametrize("answer", [None, REPLY], ids=["text", "json"])
def test_fitted_random_walks_under_auto_end_within_their_budget(vocab, table, answer) -> None:
    from tokenmold.service.request.budget.fitting import _fit_target
    from tokenmold.service.validation.verdicts import check_tool_calls

    compiled = _auto(vocab, answer=answer)
    fitting = Fitting(_fit_target(compiled), table)
    for budget in (6, 12, 30):
        for seed in range(4):
            tokens, _ = _walk(compiled, fitting, budget, seed)
            assert tokens[-1] in vocab.stop_token_ids, (budget, seed)
            _, errors = check_tool_calls(vocab.hf_tokenizer.decode(tokens[:-1]), compiled.normalized_calls)
            assert not errors, errors


def test_a_call_begun_in_free_text_closes_within_the_budget(vocab, table) -> None:
    """The walk starts with a call's trigger written (its 7 tokens paid from the budget of 45): the call
    must close in the tokens left."""
    from tokenmold.service.request.budget.fitting import _fit_target
    from tokenmold.service.validation.verdicts import check_tool_calls

    compiled = _auto(vocab)
    fitting = Fitting(_fit_target(compiled), table)
    opening = vocab.encode("Sure. <tool_call>")
    for seed in range(4):
        rng = random.Random(seed)
        matcher, fitter = compiled.token_grammar.matcher(), Fitter(fitting, 45)
        bitmask = torch.zeros((1, (table.size + 31) // 32), dtype=torch.int32)
        words, tokens = bitmask[0].numpy(), list(opening)
        for token in opening:
            assert matcher.accept_token(token)
            fitter.accept(token)
        while len(tokens) < 45:
            matcher.fill_next_token_bitmask(bitmask, 0)
            fitter.restrict(words)
            token = rng.choice(allowed_tokens(words, table.size).tolist())
            tokens.append(token)
            if token in vocab.stop_token_ids:
                break
            assert matcher.accept_token(token)
            fitter.accept(token)
        assert tokens[-1] in vocab.stop_token_ids, (seed, vocab.hf_tokenizer.decode(tokens))
        calls, errors = check_tool_calls(vocab.hf_tokenizer.decode(tokens[:-1]), compiled.normalized_calls)
        assert calls and not errors, errors


def test_a_bounded_number_is_planned_into_its_range() -> None:
    bounded = {
        "type": "object",
        "properties": {"cpus": {"type": "number", "minimum": 0.1}, "port": {"type": "integer", "minimum": 10}},
        "required": ["cpus", "port"],
    }
    assert _plan(bounded, '{"cpus":0') == '.1,"port":10}'
    assert _plan(bounded, '{"cpus":2,"port":1') == "0}"
    assert _plan(bounded, '{"cpus":2,"port":-') is None  # no negative port: the token is priced out
    for written in ('{"cpus":0', '{"cpus":0.', '{"cpus":2,"port":1'):
        plan = _plan(bounded, written)
        jsonschema.validate(json.loads(written + plan), bounded)
        for cut in range(1, len(plan)):
            assert _plan(bounded, written + plan[:cut]) == plan[cut:]
