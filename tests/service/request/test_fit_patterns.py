"""Budget fitting on strings with a pattern or a format: the shortest completion follows the
pattern's automaton (from the start and from inside an unfinished string), the up-front floor
writes the same strings, a shape the planner cannot follow is refused up front, and a short
version of the fit walk (``python -m benchmarks fit``) over MaskBench schemas."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from support.paths import MASKBENCH

from tokenmold.grammar.budget.coverage import first_gap
from tokenmold.grammar.budget.floor import shortest_text
from tokenmold.grammar.budget.patterns import FORMATS, string_rule
from tokenmold.grammar.budget.schema import FitSchema
from tokenmold.grammar.budget.tracker import Tracker
from tokenmold.service.validation.verdicts import check_json

TIME = {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}
PHONE = {"type": "string", "pattern": "^\\+[0-9 ]{6,20}$"}
CONTACT = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "reach": {"anyOf": [PHONE, {"type": "string", "format": "email"}]},
    },
    "required": ["name", "reach"],
}
EVENTS = {
    "type": "array",
    "items": {"type": "object", "properties": {"time": TIME, "what": {"type": "string"}}, "required": ["time", "what"]},
    "minItems": 2,
    "maxItems": 5,
}


def _plan(schema: dict, written: str) -> str | None:
    plan = Tracker(FitSchema(schema)).feed(written.encode()).plan()
    return plan.decode() if plan is not None else None


@pytest.mark.parametrize(
    ("schema", "written"),
    [
        (EVENTS, ""),
        (EVENTS, '[{"time":"'),
        (EVENTS, '[{"time":"2'),
        (EVENTS, '[{"time":"23:'),
        (EVENTS, '[{"time":"23:5'),
        (CONTACT, '{"name":"Ada","reach":"'),
        (CONTACT, '{"name":"Ada","reach":"+3'),
        (CONTACT, '{"name":"Ada","reach":"ada@'),
        ({"type": "string", "pattern": "^.*ab.*$", "minLength": 4}, '"x'),
        ({"type": "string", "format": "date-time"}, '"2024-02-'),
        ({"type": "string", "format": "uuid"}, '"0f'),
    ],
)
def test_the_plan_is_a_valid_completion_and_its_prefixes_plan_the_rest(schema: dict, written: str) -> None:
    plan = _plan(schema, written)
    assert plan is not None
    jsonschema.validate(json.loads(written + plan), schema, format_checker=jsonschema.FormatChecker())
    assert not check_json(written + plan, schema)[1]
    for cut in range(1, len(plan)):  # the consistency the mask relies on
        assert _plan(schema, written + plan[:cut]) == plan[cut:], (written, plan, cut)


def test_the_plan_inside_a_pattern_string_takes_the_shortest_path() -> None:
    assert _plan(TIME, '"') == '11:11"'
    assert _plan(TIME, '"2') == '1:11"'
    assert _plan(TIME, '"23:') == '11"'
    assert _plan(TIME, '"9') is None  # the grammar never writes it: no plan, the token is priced out


def test_an_open_escape_completes_with_a_character_the_pattern_takes() -> None:
    quoted = {"type": "string", "pattern": '^.*".*$'}
    assert _plan(quoted, '"\\') == '""'  # \" is the quote the pattern asks for
    assert _plan(quoted, '"') == '\\""'


def test_the_floor_writes_the_strings_the_plan_writes() -> None:
    for schema in (EVENTS, CONTACT, TIME):
        assert shortest_text(schema, schema) == _plan(schema, "")
    assert json.loads(shortest_text(EVENTS, EVENTS)) == [{"time": "11:11", "what": ""}] * 2


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_every_enforced_format_has_a_shortest_string_the_validator_accepts(form: str) -> None:
    schema = {"type": "string", "format": form}
    shortest = string_rule(schema).shortest
    assert shortest and not check_json(json.dumps(shortest), schema)[1], shortest


def test_a_shape_the_planner_cannot_follow_is_refused_with_its_place() -> None:
    huge = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[ab]*a[ab]{14}$"}}}
    gap = first_gap(huge)
    assert gap is not None and gap.pointer == "/properties/k" and "states" in gap.reason
    counted = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}
    assert first_gap({"anyOf": [counted]}).pointer == "/anyOf/0"
    assert first_gap(EVENTS) is None and first_gap(CONTACT) is None


@pytest.mark.skipif(not MASKBENCH.is_dir(), reason="the MaskBench files are not here")
def test_fitted_random_walks_over_maskbench_close_valid_within_their_budgets(vocab) -> None:
    from benchmarks.corpus import load_case
    from benchmarks.fit_walk import FitWalker, FitWalkStats

    walker, stats = FitWalker(vocab), FitWalkStats()
    for name in ("book_movie_tickets_d31f3dcf", "calculate_age_difference_69307974"):
        path = MASKBENCH / f"Glaiveai2K---{name}.json"
        if path.exists():
            walker.walk_case(load_case(path), 2, random.Random(name), stats)
    walker.walk_case(_case("events", EVENTS), 2, random.Random(1), stats)
    walker.walk_case(_case("contact", CONTACT), 2, random.Random(2), stats)
    assert stats.pairs >= 6 and not stats.failures, "\n".join(stats.failures)


def _case(name: str, schema: dict):
    from benchmarks.corpus import BenchCase

    return BenchCase(name, "tests", schema, ())


def test_the_service_refuses_an_unplannable_shape_before_decoding(vocab) -> None:
    from tokenmold.grammar import CompileOptions, Shape, ShapeCompiler
    from tokenmold.service.errors import FitUnplannable
    from tokenmold.service.request.budget.fitting import BudgetFitting

    counted = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}
    compiled = ShapeCompiler(vocab, isolation="inline").compile(Shape.from_json_schema(counted), CompileOptions())
    with pytest.raises(FitUnplannable, match="minProperties") as refused:
        BudgetFitting(vocab, None).request(compiled, compiled.engine_spec, 50)
    assert refused.value.param == "budget" and refused.value.code == "fit_unplannable"
