"""BFCL's single-turn tasks and its AST checker, from the ``bfcl-eval`` package: what the ``bfcl``
benchmark asks and how it scores one answer.

The package ships the Berkeley Function Calling Leaderboard's questions and possible answers (its
v4 release files; the four categories used here are v3's, ``simple`` renamed ``simple_python``)
and the leaderboard's own scorer, ``ast_checker``. It is installed with ``--no-deps``
(``scripts/setup.sh``): its declared dependencies pin numpy 1.26 and pull every vendor SDK its
model handlers call, none of which the checker uses. Two pieces are therefore not imported:

- ``ast_checker`` imports ``bfcl_eval.constants.model_config`` (which imports every model handler,
  hence those SDKs and tree-sitter) for a single flag, ``underscore_to_dot`` of the model being
  scored; ``load_checker`` registers a module holding that one entry in its place before importing
  the checker, whose code then runs unchanged.
- The handlers' ``convert_to_tool`` (in a module that imports the tree-sitter parsers) turns a BFCL
  function into an OpenAI tool; ``openai_tool`` does the same for the OpenAI chat style, on the
  package's own type table (``GORILLA_TO_OPENAPI``): dots in names become underscores (OpenAI's
  name pattern has none, and the checker maps them back), BFCL's types become JSON Schema's.
"""

from __future__ import annotations

import copy
import json
import random
import re
import sys
import types
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

#: BFCL v3's single-turn categories and the file each is in (the package's v4 names).
CATEGORIES: dict[str, str] = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
}
#: The name the checker scores under; its only use is the ``underscore_to_dot`` lookup.
CHECKER_MODEL = "tokenmold-bench-fc"


@dataclass(frozen=True)
class Task:
    id: str
    category: str
    #: The conversation (BFCL's first turn: OpenAI chat messages).
    messages: list[dict[str, Any]]
    #: BFCL's function documents, as the checker reads them.
    functions: list[dict[str, Any]]
    #: The possible answers: one ``{name: {param: [allowed values]}}`` per expected call.
    ground_truth: list[dict[str, Any]]


@dataclass(frozen=True)
class Call:
    name: str
    #: The arguments' JSON text as the server returned it.
    arguments: str


@dataclass
class TurnScore:
    """One answer judged: the figures the table adds up, and the checker's reason on a miss."""

    #: At least one call, each with a JSON object as arguments (BFCL's function-call format).
    well_formed: bool
    #: The checker accepted the calls.
    correct: bool
    #: Two calls with the same name and equal arguments.
    repeated_call: bool
    #: ``max_tokens`` ended the turn and no complete call came back.
    cut_without_call: bool
    error: list[str] = field(default_factory=list)
    error_type: str | None = None


def load_tasks(per_category: int, seed: int) -> list[Task]:
    """``per_category`` tasks of each category, a seeded sample in file order: the same tasks on
    every run and every server."""
    data = resources.files("bfcl_eval") / "data"
    tasks = []
    for category, name in CATEGORIES.items():
        questions = _json_lines((data / name).read_text(encoding="utf-8"))
        answers = {
            a["id"]: a["ground_truth"] for a in _json_lines((data / "possible_answer" / name).read_text("utf-8"))
        }
        picked = sorted(random.Random(f"{seed}:{category}").sample(range(len(questions)), per_category))
        for index in picked:
            q = questions[index]
            tasks.append(Task(q["id"], category, q["question"][0], q["function"], answers[q["id"]]))
    return tasks


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def openai_tool(function: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """A BFCL function document as an OpenAI chat tool (``convert_to_tool`` for the OpenAI
    completions style, see the module docstring)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    item = copy.deepcopy(function)
    item["name"] = item["name"].replace(".", "_")
    item["parameters"]["type"] = "object"
    item["parameters"]["properties"] = _openai_types(item["parameters"]["properties"], GORILLA_TO_OPENAPI)
    if strict:
        item["strict"] = True
    return {"type": "function", "function": item}


def _openai_types(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type``: each property's type mapped (unknown: string; a float also
    says so in its description, as BFCL tells every OpenAI-style model), nested one level into
    array items and object properties."""
    for schema in properties.values():
        given = schema.get("type")
        if given == "float":
            schema["format"] = "float"
            schema["description"] = schema.get("description", "") + " This is a float type value."
        schema["type"] = mapping.get(given, "string") if given is not None else "string"
        if schema["type"] in ("array", "object"):
            if "properties" in schema:
                schema["properties"] = _openai_types(schema["properties"], mapping)
            elif "items" in schema:
                items = schema["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _openai_types(items["properties"], mapping)
    return properties


def load_checker() -> Any:
    """BFCL's ``ast_checker`` function, imported without its model registry (module docstring):
    the model it scores is registered as one whose dots became underscores."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        registry = types.ModuleType(name)
        registry.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=True)}  # type: ignore[attr-defined]
        sys.modules[name] = registry
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker


def decode_calls(calls: list[Call]) -> list[dict[str, Any]] | None:
    """The calls in the checker's form, ``[{name: {param: value}}]``, as BFCL's function-calling
    handlers decode them; ``None`` when there is no call or an argument text is not a JSON object."""
    decoded = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            return None
        if not isinstance(arguments, dict):
            return None
        decoded.append({call.name: arguments})
    return decoded or None


def score_turn(task: Task, calls: list[Call], finish_reason: str | None) -> TurnScore:
    """Judge one answer with BFCL's checker."""
    from bfcl_eval.constants.enums import Language

    decoded = decode_calls(calls)
    keys = [(c.name, _canonical(c.arguments)) for c in calls]
    score = TurnScore(
        well_formed=decoded is not None,
        correct=False,
        repeated_call=len(set(keys)) < len(keys),
        cut_without_call=finish_reason == "length" and not calls,
    )
    if decoded is None:
        score.error_type = "no_call" if not calls else "arguments_not_an_object"
        return score
    result = load_checker()(
        task.functions, decoded, task.ground_truth, Language.PYTHON, _checker_category(task), CHECKER_MODEL
    )
    score.correct = bool(result["valid"])
    if not score.correct:
        score.error = [str(e) for e in result.get("error", [])]
        score.error_type = result.get("error_type")
    return score


def _checker_category(task: Task) -> str:
    """The checker picks its rule from the category's name (parallel, then multiple, else simple)."""
    return "simple_python" if task.category == "simple" else task.category


def _canonical(arguments: str) -> str:
    """Arguments compared as values, not as text (key order and spacing aside)."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return re.sub(r"\s+", "", arguments)
