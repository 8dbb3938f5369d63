"""Which grammar dialect a ``grammar`` text is written in: xgrammar's EBNF (GBNF-like) or Lark.

vLLM's ``structured_outputs.grammar`` has no field that names the dialect; its backends guess
(the xgrammar backend: Lark unless a line, comments stripped, holds ``::=``; the guidance backend:
Lark when a line begins with ``start:`` or ``%llguidance``). tokenmold decides by the one
construct every EBNF grammar has and no Lark grammar can have: a rule *defined* with ``::=``.

    A grammar is EBNF when one of its lines begins with a rule definition ``name ::=``
    (leading whitespace allowed); otherwise it is Lark.

This agrees with vLLM's xgrammar rule on every grammar either dialect accepts, except that a
``::=`` inside a Lark string literal (``start: "a ::= b"``) or after a ``#`` no longer decides,
and with llguidance's rule on every EBNF grammar (they never begin a line with ``start:``).
"""

from __future__ import annotations

import enum
import re

#: A line that begins with an EBNF rule definition (xgrammar's rule names: letters, digits, ``_``,
#: ``-`` and ``.``, not starting with a digit).
_EBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z_][\w.-]*[ \t]*::=")


class Dialect(str, enum.Enum):
    EBNF = "ebnf"
    LARK = "lark"


def grammar_dialect(text: str) -> Dialect:
    """The dialect of ``text`` (see the module docstring for the rule)."""
    return Dialect.EBNF if _EBNF_RULE.search(text) else Dialect.LARK
