"""Open objects on the real engine: 100 seeded samples of an explicitly open object, none with a
repeated key, none with more extra keys than the layout allows (``tokenmold.grammar.object_keys``)."""

from __future__ import annotations

import re

import pytest

from tokenmold.grammar import CompileOptions, Shape
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.request.runtime import Prompt

pytestmark = pytest.mark.engine

#: Values are integers, so every ``"...":`` in an output is a key of the one object.
SCORES = {
    "type": "object",
    "properties": {"player": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["player"],
    "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99},
}
_KEY = re.compile(r'[{,]\s*"((?:[^"\\]|\\.)*)"\s*:')


async def test_an_open_object_never_repeats_a_key(engine_runtime) -> None:
    options = CompileOptions(max_extra_properties=4)
    texts = []
    for seed in range(10):
        result = await engine_runtime.generate(
            Prompt.user("Write the scores of player 3 in many games as JSON, one key per game."),
            Shape.from_json_schema(SCORES),
            SamplingOptions(max_tokens=80, temperature=1.0, seed=seed, n=10),
            options,
        )
        assert result.compiled is not None
        assert [n.keyword for n in result.compiled.report.narrowed] == ["maxProperties"]
        texts += [completion.verdict.text for completion in result.completions]
    assert len(texts) == 100
    for text in texts:
        keys = _KEY.findall(text)
        assert keys[:1] == ["player"], text
        assert len(keys) == len(set(keys)), f"repeated key in {text!r}"
        assert len(keys) <= 1 + options.max_extra_properties, text
