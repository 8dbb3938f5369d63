"""The ``bfcl`` benchmark's glue around BFCL's own checker: which tasks it asks, how a BFCL function
becomes an OpenAI tool, how an answer is decoded and judged, and the chat template both servers
render. No engine: the checker and the template run for real on BFCL's shipped tasks."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from benchmarks.bfcl import render, tool_template, write_model_dir
from benchmarks.bfcl_tasks import CATEGORIES, Call, Task, load_tasks, openai_tool, score_turn


@cache
def _sample() -> list[Task]:
    return load_tasks(15, 0)


def _task(task_id: str) -> Task:
    """A task of the default sample, by id."""
    return next(t for t in _sample() if t.id == task_id)


def _expected_calls(task: Task) -> list[Call]:
    """The first possible answer of each expected call, as a server returns it (names with dots
    sent as underscores, optional arguments left out)."""
    calls = []
    for expected in task.ground_truth:
        ((name, params),) = expected.items()
        arguments = {key: values[0] for key, values in params.items() if values[0] != ""}
        calls.append(Call(name.replace(".", "_"), json.dumps(arguments)))
    return calls


def test_the_sample_is_fixed_per_seed_and_balanced() -> None:
    tasks = _sample()
    assert [t.id for t in tasks] == [t.id for t in load_tasks(15, 0)]
    assert {c: sum(t.category == c for t in tasks) for c in CATEGORIES} == dict.fromkeys(CATEGORIES, 15)
    assert [t.id for t in load_tasks(15, 1)] != [t.id for t in tasks]
    assert all(t.messages and t.functions and t.ground_truth for t in tasks)


def test_a_bfcl_function_becomes_a_strict_openai_tool() -> None:
    function = {
        "name": "geometry.area_circle",
        "description": "Area of a circle.",
        "parameters": {
            "type": "dict",
            "properties": {
                "radius": {"type": "float", "description": "The radius."},
                "units": {"type": "array", "items": {"type": "tuple"}, "description": "Units."},
                "note": {"description": "No type given."},
            },
            "required": ["radius"],
        },
    }
    tool = openai_tool(function, strict=True)
    body = tool["function"]
    assert tool["type"] == "function" and body["strict"] is True
    assert body["name"] == "geometry_area_circle"
    assert body["parameters"]["type"] == "object"
    properties = body["parameters"]["properties"]
    assert properties["radius"]["type"] == "number" and properties["radius"]["format"] == "float"
    assert properties["units"] == {"type": "array", "items": {"type": "array"}, "description": "Units."}
    assert properties["note"]["type"] == "string"
    assert function["parameters"]["type"] == "dict", "the task's own document is left as the checker reads it"


def test_the_expected_calls_pass_the_checker_in_every_category() -> None:
    for task_id in ("simple_python_35", "multiple_6", "parallel_33", "parallel_multiple_14"):
        task = _task(task_id)
        calls = _expected_calls(task)
        score = score_turn(task, list(reversed(calls)), "tool_calls")  # parallel calls in any order
        assert score.well_formed and score.correct, (task_id, score.error)
        assert not score.repeated_call and not score.cut_without_call


def test_a_wrong_value_or_a_repeated_call_fails() -> None:
    task = _task("simple_python_35")
    (call,) = _expected_calls(task)
    arguments = json.loads(call.arguments)
    first = next(iter(arguments))
    wrong = Call(call.name, json.dumps({**arguments, first: "not the value"}))
    score = score_turn(task, [wrong], "tool_calls")
    assert score.well_formed and not score.correct and score.error_type and score.error

    respaced = Call(call.name, json.dumps(arguments, indent=2))
    twice = score_turn(task, [call, respaced], "tool_calls")
    assert twice.repeated_call and not twice.correct


def test_answers_without_a_usable_call() -> None:
    task = _task("simple_python_35")
    cut = score_turn(task, [], "length")
    assert cut.cut_without_call and not cut.well_formed and not cut.correct
    assert not score_turn(task, [], "stop").cut_without_call
    (call,) = _expected_calls(task)
    kept = score_turn(task, [call], "length")
    assert kept.correct and not kept.cut_without_call, "a cut turn that kept its complete call is scored"
    not_an_object = score_turn(task, [Call(call.name, "[1, 2]")], "tool_calls")
    assert not not_an_object.well_formed and not not_an_object.correct


def test_both_servers_render_tokenmolds_own_tool_instruction(vocab) -> None:
    from tokenmold.grammar.toolformats import HERMES
    from tokenmold.schemas.openai import ToolDefinition
    from tokenmold.service.request.tools import tool_instruction

    def rendered(messages: list[dict[str, str]], tools: list[dict] | None) -> str:
        return vocab.hf_tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=tool_template(), add_generation_prompt=True, tokenize=False
        )

    task = _task("parallel_multiple_14")
    tools = [openai_tool(f, strict=True) for f in task.functions]
    instruction = tool_instruction([ToolDefinition.model_validate(t) for t in tools], "required", tool_format=HERMES)
    user = task.messages[0]["content"]
    assert rendered(task.messages, tools) == (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}, *task.messages]
    assert rendered(system, tools).startswith(f"<|im_start|>system\nBe brief.\n\n{instruction}<|im_end|>\n")
    plain = rendered(task.messages, None)
    assert plain == vocab.hf_tokenizer.apply_chat_template(task.messages, add_generation_prompt=True, tokenize=False)


def test_the_model_folder_is_the_embedded_model_with_that_template(tmp_path: Path, model_path: str) -> None:
    folder = write_model_dir(tmp_path)
    assert folder.name == Path(model_path).name, "tokenmold serves it under the same id"
    assert (folder / "chat_template.jinja").read_text(encoding="utf-8") == tool_template()
    assert (folder / "model.safetensors").resolve() == (Path(model_path) / "model.safetensors").resolve()
    assert (folder / "tokenizer.json").resolve() == (Path(model_path) / "tokenizer.json").resolve()


def test_the_table_counts_each_figure() -> None:
    from benchmarks.bfcl import Turn

    task = _task("simple_python_35")
    (call,) = _expected_calls(task)
    good = Turn(task.id, task.category, 200, "tool_calls", [call], None, 100, 20, 1.0, score_turn(task, [call], "stop"))
    cut = Turn(task.id, task.category, 200, "length", [], "<tool_call>", 100, 512, 9.0, score_turn(task, [], "length"))
    text = render({"vllm": [good, good], "tokenmold": [good, cut]})
    vllm_row, tokenmold_row = text.splitlines()[2:4]
    assert vllm_row.split()[1:4] == ["100.0%", "100.0%", "2/2"]
    assert tokenmold_row.split()[1:4] == ["50.0%", "50.0%", "1/2"]
    assert tokenmold_row.split()[-2:] == ["1", "0"]
    assert text.splitlines()[-1].endswith("2/2")
