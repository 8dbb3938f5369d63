"""Token slices for llguidance's masks: runs of letters and digits allowed wholesale.

llguidance computes a mask by walking the token trie through its lexer, except for *slices*:
groups of tokens, each given as a regex when the tokenizer is built, that a mask takes wholesale
(one OR of a precomputed set) wherever llguidance proves the lexer state's remaining language holds
every string of the slice as a prefix; the tokens of the other slices are walked. Its default
slices are JSON string content (``[^"\\\\\\x00-\\x1F\\x7F]`` runs of 1-10, 1-30 and any length),
so inside a plain or ``maxLength``-bounded string a mask costs a few microseconds. A string whose
``pattern`` or ``format`` allows only letters and digits (``^[0-9A-Za-z]{1,64}$``, an e-mail's
local part, a URI's scheme) subsumes none of them, and every mask at a state llguidance meets for
the first time walks every alphanumeric token: a slow mask, and a large share of tokenmold's slow
masks on MaskBench (docs/design.md).

``with_tokenmold_slices`` puts runs of letters and digits first (each token joins the first slice
whose regex it matches, so these take the alphanumeric tokens out of the defaults), in lengths that
a counted run can still subsume as its count goes down; runs of lowercase letters and digits come
before runs of any case, so a lowercase-only class takes them wholesale too. A mask is the same set
of tokens with any slices (llguidance only takes a slice it has proved contained;
tests/grammar/test_llguidance_slices.py compares them position by position); what changes is how much of
the trie each mask walks.

Each slice is also a lexeme of every grammar llguidance parses with that tokenizer, so the ten add
a noticeable share to every grammar's parse (docs/design.md; ``python -m benchmarks tokenizers``,
docs/benchmarks.md). ``LLTokenizers`` keeps a second tokenizer and gives a grammar the
sliced one only where a slice can pay. A JSON Schema grammar none of whose strings is narrower than
JSON string content parses with the other, whose one slice is string content of any length: every
string there is unbounded (``maxLength`` sends a grammar to the sliced tokenizer), so llguidance's
bounded content slices (1-10 and 1-30 characters) and its whitespace (compact JSON has none) would
only be parsed, never used (time added to every grammar's parse).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Alphanumeric runs, shortest first, placed before llguidance's defaults: lowercase letters and
#: digits first (slugs and ids, ``^[a-z0-9-]+$``, which no run with capitals fits), then any case.
#: Measured on MaskBench's 200-file sample against the defaults alone and against other chains
#: (docs/benchmarks.md): lowercase first keeps slugs and ids on a slice as well.
ALNUM_SLICES = (
    "[a-z0-9]{1,2}",
    "[a-z0-9]{1,4}",
    "[a-z0-9]{1,8}",
    "[a-z0-9]{1,16}",
    "[a-z0-9]+",
    "[a-zA-Z0-9]{1,2}",
    "[a-zA-Z0-9]{1,4}",
    "[a-zA-Z0-9]{1,8}",
    "[a-zA-Z0-9]{1,16}",
    "[a-zA-Z0-9]+",
)


def with_tokenmold_slices(ll_tokenizer: Any) -> Any:
    """``ll_tokenizer`` (an ``llguidance.LLTokenizer``) with ``ALNUM_SLICES`` before llguidance's
    general slices: a new tokenizer, whose slices take a noticeable time to build on a vocabulary
    (once per process, inside the startup warm-up)."""
    import llguidance

    return ll_tokenizer.with_slices([*ALNUM_SLICES, *llguidance.LLTokenizer.general_slices()])


#: JSON string content of any length, as llguidance writes its own slice of it.
STRING_CONTENT = '[^"\\\\\\x00-\\x1F\\x7F]+'


#: How ``grammar_from_json_schema`` serializes a schema (llguidance 1.x); any other text is a grammar
#: whose lexemes are not known here, and parses with the slices.
_JSON_SCHEMA_GRAMMAR = '{ "grammars": [{ "json_schema": '

#: Keywords that make a JSON string lexeme narrower than string content, or counted: the lexer
#: states where a run of letters and digits can be taken wholesale and llguidance's slices cannot.
#: Read in the text, so a property of one of these names also counts (the slices, as before).
_NARROWING_KEYWORDS = ('"pattern"', '"format"', '"propertyNames"', '"patternProperties"', '"maxLength"')


def wants_alnum_slices(grammar: str) -> bool:
    """Whether ``grammar`` (llguidance's serialized form) may meet a lexer state where
    ``ALNUM_SLICES`` save a trie walk: every grammar but a JSON schema's that names none of
    ``_NARROWING_KEYWORDS`` (its strings are plain content, its numbers take no letters, its keys
    and enums are literals)."""
    if not grammar.startswith(_JSON_SCHEMA_GRAMMAR):
        return True
    return any(keyword in grammar for keyword in _NARROWING_KEYWORDS)


@dataclass(frozen=True)
class LLTokenizers:
    """One vocabulary's llguidance tokenizers: ``plain`` with string content as its one slice,
    ``sliced`` with tokenmold's before llguidance's own. A mask is the same with either;
    ``for_grammar`` picks the one that parses and masks ``grammar`` faster."""

    plain: Any
    sliced: Any

    @classmethod
    def of(cls, ll_tokenizer: Any) -> LLTokenizers:
        """``ll_tokenizer``'s copies with ``STRING_CONTENT`` alone and with tokenmold's slices."""
        return cls(ll_tokenizer.with_slices([STRING_CONTENT]), with_tokenmold_slices(ll_tokenizer))

    def for_grammar(self, grammar: str) -> Any:
        return self.sliced if wants_alnum_slices(grammar) else self.plain
