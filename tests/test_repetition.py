"""The repetition guard's detector (``tokenmold.service.repetition``) on real tokenizations, and the
verdict it leads to. The engine path (a looping output stopped early) is in tests/test_engine_e2e.py."""

from __future__ import annotations

import pytest

from tokenmold.schemas.verdict import Usage, VerdictStatus
from tokenmold.service.repetition import LoopWatch, RepetitionGuard, open_value
from tokenmold.service.validation import judge

GUARD = RepetitionGuard()


def _watch(vocab, text: str, *, guard: RepetitionGuard = GUARD, chunk: int = 3) -> tuple[str | None, int]:
    """Feed ``text``'s tokens in chunks, as the engine's deltas come; (pointer, tokens fed) at the
    first loop found, or (None, all tokens)."""
    watch = LoopWatch(guard, vocab.hf_tokenizer.decode)
    ids = vocab.encode(text)
    for start in range(0, len(ids), chunk):
        found = watch.feed(0, ids[start : start + chunk])
        if found is not None:
            return found.pointer, start + chunk
    return None, len(ids)


def test_a_string_looping_on_a_short_cycle_is_caught_early(vocab) -> None:
    pointer, fed = _watch(vocab, '{"name": "John", "email": "john' + "_john" * 200)
    assert pointer == "/email"
    assert fed < 80  # ~8 cycles of 3 tokens past the prefix, far from the 600 tokens written


def test_the_pointer_follows_nesting_and_numbers_loop_too(vocab) -> None:
    assert _watch(vocab, '{"people": [{"a": 1}, {"bio": "ab' + "cd" * 300)[0] == "/people/1/bio"
    assert _watch(vocab, '{"x": {"ratio": 1.' + "0" * 300)[0] == "/x/ratio"
    assert _watch(vocab, '["ok", "' + "la " * 300)[0] == "/1"
    assert _watch(vocab, '{"a": 1, "' + "key_" * 300)[0] == ""  # a key being written: its object


def test_repetition_across_values_is_not_a_loop(vocab) -> None:
    """Equal elements repeat exactly, but each is a new, bounded value: never cut."""
    assert _watch(vocab, '{"xs": [' + ", ".join(["7"] * 400) + "]}") == (
        None,
        len(vocab.encode('{"xs": [' + ", ".join(["7"] * 400) + "]}")),
    )
    rows = ", ".join(['{"id": 1, "tag": "a"}'] * 100)
    assert _watch(vocab, "[" + rows + "]")[0] is None


def test_short_or_irregular_repetition_is_left_alone(vocab) -> None:
    assert _watch(vocab, '{"laugh": "' + "ha" * 12 + '"}')[0] is None  # below the minimum length
    assert _watch(vocab, '{"text": "' + " ".join(f"word{i}" for i in range(200)))[0] is None


def test_the_thresholds_are_configurable(vocab) -> None:
    text = '{"s": "' + "ab" * 40
    assert _watch(vocab, text)[0] == "/s"
    assert _watch(vocab, text, guard=RepetitionGuard(min_repeats=60, min_tokens=200))[0] is None
    with pytest.raises(ValueError):
        RepetitionGuard(min_repeats=1)


def test_open_value_reads_partial_json() -> None:
    assert open_value('{"a": "x\\" y') is not None and open_value('{"a": "x\\" y').pointer == "/a"
    assert open_value('{"a": "x", ') is None  # between values
    assert open_value('{"a/b": {"c~d": [1, 2, 3') == open_value('{"a/b": {"c~d": [1, 2, 3')
    assert open_value('{"a/b": {"c~d": [1, 2, 3').pointer == "/a~1b/c~0d/2"


def test_a_cut_output_is_truncated_with_stop_reason_repetition() -> None:
    usage = Usage(prompt_tokens=5, completion_tokens=40, total_tokens=45)
    verdict = judge(
        '{"email": "john_john_john',
        finish_reason=None,
        stop_reason=None,
        compiled=None,
        usage=usage,
        looping_at="/email",
    )
    assert verdict.status is VerdictStatus.TRUNCATED and verdict.value is None
    assert (verdict.finish_reason, verdict.stop_reason) == ("length", "repetition")
    assert [(e.path, e.keyword) for e in verdict.errors] == [("/email", "repetition")]
    plain = judge("{}", finish_reason="length", stop_reason=None, compiled=None, usage=usage)
    assert plain.stop_reason is None


def test_the_cli_option_takes_a_count_or_off() -> None:
    import argparse

    from tokenmold.service.cli import _repetition_guard

    assert _repetition_guard("off") is None
    assert _repetition_guard("12") == RepetitionGuard(min_repeats=12)
    for bad in ("1", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            _repetition_guard(bad)
