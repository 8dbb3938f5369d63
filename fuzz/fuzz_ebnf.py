"""Fuzz the EBNF and regex front ends: arbitrary and spliced grammar text through xgrammar's parser
(via tokenmold's backend, vocabulary-free). Allowed outcomes: a grammar, or a typed ShapeError with
a line/column. A native crash here would take down a compile worker, never the server, and the
shape would be refused as ``compile_failed``; the one found so far (a rule that only repeats
itself, a stack overflow in xgrammar 0.2.8) is refused before xgrammar sees it."""

from __future__ import annotations

import atheris

with atheris.instrument_imports(include=["tokenmold.grammar"]):
    from tokenmold.grammar.backends.xgrammar import XGrammarBackend
    from tokenmold.grammar.errors import ShapeError
    from tokenmold.grammar.vocabulary import EMPTY_VOCABULARY

from harness import run

BACKEND = XGrammarBackend(EMPTY_VOCABULARY)
PIECES = [
    "root ::= ",
    '"a"',
    "[a-z]",
    "[^\\n]",
    "*",
    "+",
    "?",
    "{2,3}",
    "{0,}",
    " | ",
    "(",
    ")",
    "root",
    "x",
    "\nx ::= ",
    'x "b"',
    "\\",
    '"',
    "\n",
    "(=",
    "[",
    "]",
    "-",
    "\\u0041",
    'root ::= root "a" | "b"',
    "a",
    "b",
    ".",
    "^",
    "$",
    "(?:",
    "(?=",
    "\\d",
    "\\w",
    "{1000}",
    "|",
]


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    regex = fdp.ConsumeBool()
    if fdp.ConsumeBool():
        text = fdp.ConsumeUnicodeNoSurrogates(200)
    else:
        text = "".join(fdp.PickValueInList(PIECES) for _ in range(fdp.ConsumeIntInRange(1, 24)))
    if not regex and not text.strip():
        return  # Shape.from_ebnf refuses empty grammars before the backend
    try:
        compiled = BACKEND.compile_regex(text) if regex else BACKEND.compile_ebnf(text)
    except ShapeError as exc:
        assert str(exc)
        return
    compiled.accepts(fdp.ConsumeUnicodeNoSurrogates(40))


if __name__ == "__main__":
    run(test_one_input)
