"""Reasoning without an engine: which of vLLM's parsers work on the embedded vocabulary, the split
of an output whose prompt ended the thinking, the thinking's token count, and the reasoning
fields of the chat and Responses answers (the engine path: tests/engine/test_reasoning_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenmold.grammar.toolformats import HERMES
from tokenmold.schemas.openai import ChatCompletionRequest
from tokenmold.schemas.responses import ResponsesRequest
from tokenmold.schemas.verdict import Usage, Verdict, VerdictStatus
from tokenmold.service.api.responses import response_from_chat, response_shell, responses_plan
from tokenmold.service.api.translate import ChatStream, chat_plan, chat_response
from tokenmold.service.request.reasoning import ReasoningMarkers, ReasoningParser
from tokenmold.service.request.runtime import Completion, GenerationResult, StreamDelta

MODEL = SimpleNamespace(vocab_size=49152, template_renders_tools=False, tool_format=HERMES)
MARKERS = ReasoningMarkers(end="</think>", start="<think>")
USER = [{"role": "user", "content": "q"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


@pytest.fixture(scope="module")
def tokenizer(model_path: str):
    from tokenmold.service.engine.model_info import ModelInfo

    return ModelInfo.load(model_path).tokenizer


def test_qwen3_runs_as_olmo3_where_the_vocabulary_spells_its_marker_in_pieces(tokenizer) -> None:
    """vLLM's qwen3 parser looks for ``</think>`` as one token; SmolLM2 spells it in three, so the
    engine runs olmo3, which reads the same markers in pieces, and says so."""
    parser = ReasoningParser.load("qwen3", tokenizer)
    assert (parser.name, parser.engine_name) == ("qwen3", "olmo3")
    assert parser.note is not None and "3 tokens" in parser.note and "olmo3" in parser.note
    assert (parser.markers.start, parser.markers.end) == ("<think>", "</think>")
    turn = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert parser.thinks_after(tokenizer.encode(turn + "<think>\n"))
    assert not parser.thinks_after(tokenizer.encode(turn + "<think>\n\n</think>\n\n"))


def test_a_parser_with_no_twin_for_its_markers_is_refused(tokenizer) -> None:
    """A parser whose markers no other parser reads in pieces is refused at start-up, naming why."""
    with pytest.raises(ValueError, match=r"seed_oss.*does not see its end marker .</seed:think>. .*5 tokens"):
        ReasoningParser.load("seed_oss", tokenizer)


def test_olmo3_sees_the_thinking_open_or_closed_by_the_prompt(tokenizer) -> None:
    parser = ReasoningParser.load("olmo3", tokenizer)
    assert (parser.markers.start, parser.markers.end) == ("<think>", "</think>")
    turn = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert parser.thinks_after(tokenizer.encode(turn + "<think>\n"))
    assert not parser.thinks_after(tokenizer.encode(turn + "<think>\n\n</think>\n\n"))


def test_an_output_after_a_closed_thinking_block_is_all_answer() -> None:
    text = 'Not thinking: </think> is only text here {"a": 1}'
    assert MARKERS.split(text, thinking=False) == ("", text)
    stream = MARKERS.stream(thinking=False)
    assert stream.answering and stream.feed(text) == ("", text)


def test_the_thinking_tokens_end_with_the_marker() -> None:
    pieces = ["Hm", ".", "</", "think", ">", "{", "}"]

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    assert MARKERS.thinking_tokens(list(range(7)), decode) == 5
    assert MARKERS.thinking_tokens(list(range(3)), decode) == 3  # cut off while thinking: all of it


def _verdict(text: str) -> Verdict:
    return Verdict(
        status=VerdictStatus.ACCEPTED,
        text=text,
        finish_reason="stop",
        usage=Usage(prompt_tokens=5, completion_tokens=9, total_tokens=14),
    )


def test_the_reasoning_comes_under_both_names_with_its_tokens_counted() -> None:
    result = GenerationResult(
        [Completion(0, _verdict("42"), [1], reasoning="Six times seven.", reasoning_tokens=6)], None, 5
    )
    completion = chat_response(
        result,
        chat_plan(chat(), MODEL),
        model="m",
    )
    message = completion.choices[0].message
    assert message.reasoning == message.reasoning_content == "Six times seven."
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 6
    body = ResponsesRequest(model="m", input="q")
    response = response_from_chat(completion, response_shell(body, model="m"))
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 6


def test_streamed_reasoning_deltas_carry_both_names() -> None:
    stream = ChatStream(chat_plan(chat(), MODEL), model="m")
    chunks = stream.chunks(StreamDelta(0, "", [1, 2], reasoning="Hm.", reasoning_tokens=2))
    delta = chunks[-1].choices[0].delta.model_dump(exclude_none=True)
    assert delta == {"reasoning_content": "Hm.", "reasoning": "Hm."}
    assert stream.usage_chunk().usage.completion_tokens_details.reasoning_tokens == 2  # type: ignore[union-attr]


def test_reasoning_effort_reaches_the_template_as_vllm_hands_it_over() -> None:
    def kwargs(**fields) -> dict:
        body = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        )
        return chat_plan(body, MODEL).prompt.template_kwargs

    assert kwargs(reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert kwargs(reasoning_effort="high")["enable_thinking"] is True
    assert kwargs(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False})["enable_thinking"] is False
    assert kwargs() == {}


def test_responses_hand_the_reasoning_fields_to_the_chat_path() -> None:
    body = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": "q",
            "reasoning": {"effort": "none", "summary": "auto"},
            "thinking_token_budget": 16,
            "chat_template": "{{ messages }}",
        }
    )
    plan = responses_plan(body, MODEL)
    assert plan.sampling.thinking_token_budget == 16 and plan.prompt.template == "{{ messages }}"
    assert plan.prompt.template_kwargs["enable_thinking"] is False
