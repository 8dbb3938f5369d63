"""The grammar store on the real engine (the in-process runtime, which runs with a store): what
the directory holds under a shape's key is what a fresh engine applies, loaded instead of compiled.

A restart is an engine to which the shape is new while the directory holds it. The proof that the
engine loaded it rather than compiled it: the file kept under a new shape's key holds another
shape's grammar, and the engine's output follows that other grammar. (The figures of a real
restart, cold against loaded, are ``python -m benchmarks grammar_store``, docs/benchmarks.md.)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tokenmold.grammar import Shape
from tokenmold.grammar.store import GrammarStore
from tokenmold.schemas.sampling import SamplingOptions
from tokenmold.service.request.runtime import Prompt
from tokenmold.service.vllm_core.xgrammar_store import NAMESPACE

pytestmark = pytest.mark.engine

#: xgrammar shapes slow enough to be kept (``grammar.store.MIN_COMPILE_S``, 50 ms) on an idle
#: host too: six bounded runs compile in about 0.2 s on 2 cores (one run of ``[a-z]{30,80}`` takes
#: about the threshold itself, so it would be kept or not by chance).
_RUNS = ' "-" [a-z]{30,80} "-" [0-9]{30,80} "-" [a-y]{30,80} "-" [b-z]{30,80} "-" [c-x]{30,80} "-" [d-w]{30,80}'
DOG = 'root ::= "dog-"' + _RUNS
COW = 'root ::= "cow-"' + _RUNS
ASK = Prompt.user("Name an animal.")


def _kept_key(directory: Path, spec: str) -> str | None:
    """The key of the engine's file for ``spec`` (its header holds the key: the engine's tokenizer
    digest, then the grammar), or ``None`` while it is not written."""
    for path in (directory / NAMESPACE).glob("*.grammar"):
        key: str = json.loads(path.read_bytes().split(b"\n", 2)[1])["key"]
        if key.endswith("\n" + spec):
            return key
    return None


async def test_a_fresh_engine_applies_the_grammar_the_store_holds(engine_runtime) -> None:
    rt = engine_runtime
    directory = Path(rt.config.engine.grammar_cache_dir)
    dog = await rt.generate(ASK, Shape.from_ebnf(DOG), SamplingOptions(max_tokens=6, temperature=0))
    assert dog.completions[0].verdict.text.startswith("dog-")
    dog_spec = dog.compiled.engine_spec.text
    for _ in range(600):  # the engine writes in the background once it compiled the grammar
        dog_key = _kept_key(directory, dog_spec)
        if dog_key is not None:
            break
        await asyncio.sleep(0.1)
    assert dog_key is not None, f"the engine kept no grammar in {directory}"
    store = GrammarStore(directory)
    dog_grammar = store.load(NAMESPACE, dog_key)
    assert dog_grammar is not None
    # A shape this engine never saw: its key, with the dog's grammar planted under it.
    cow = await rt.compile(Shape.from_ebnf(COW))
    tokenizer_digest = dog_key.split("\n", 1)[0]
    store.save(NAMESPACE, f"{tokenizer_digest}\n{cow.engine_spec.text}", dog_grammar)
    planted = await rt.generate(ASK, Shape.from_ebnf(COW), SamplingOptions(max_tokens=6, temperature=0))
    # The stored grammar, not the shape's own (which forces "cow-"): loaded, not compiled.
    assert planted.completions[0].verdict.text.startswith("dog-"), planted.completions[0].verdict
    # The service side kept its compile results too (the spec of each shape, by its cache key).
    assert len(list((directory / "shapes").glob("*.grammar"))) >= 1
