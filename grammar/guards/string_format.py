"""The string formats the pattern guard holds: llguidance's own expressions, anchored.

llguidance turns ``format: hostname``, ``email`` and ``uri`` into regular expressions whose
counted runs and wide classes its token trie walk has no shortcut for: a mask at every position
of a hostname, an email or pydantic's ``HttpUrl`` (``uri`` with ``maxLength: 2083``), and more at a
URI's scheme and host, costs an order of magnitude more than in a plain string (measured on the
embedded model's vocabulary: docs/guards.md, "What each guard holds"). Their automata are small
(250, 59 and 339 states), so the pattern guard (``tokenmold.grammar.guards.anchored_pattern``) runs them the
way it runs a counted pattern: the string compiles without its ``format`` and the guard ANDs the
row of the state its content reached. The expressions are llguidance's (1.7.6,
``parser/src/json/formats.rs``; unchanged since) with their named groups made plain, so the mask
admits the same strings it admitted before; the validation layer then checks the format as the
validator reads it, as before. The other formats llguidance knows stay in its grammar: its masks
there are as fast as in a plain string.
"""

from __future__ import annotations

import re

_HOSTNAME = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"

_EMAIL = "".join(
    (
        r"(?P<local_part>(?P<dot_string>[a-zA-Z0-9!#$%&'*+\-/=?\^_`{|}~]+(\.[a-zA-Z0-9!#$%&'*+\-/=?\^_`{|}~]+)*))",
        r"@(",
        r"(?P<domain>(?P<sub_domain>[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.(?P<sub_domain2>[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?))*)",
        r"|",
        r"\[(?P<ipv4>((([0-9])|(([1-9])[0-9]|(25[0-5]|(2[0-4]|(1)[0-9])[0-9])))\.){3}(([0-9])|(([1-9])[0-9]|(25[0-5]|(2[0-4]|(1)[0-9])[0-9]))))\]",
        r")",
    )
)

_SEGMENT_CHAR = r"(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})"
_H16 = r"[0-9a-fA-F]{1,4}"

_URI = "".join(
    (
        r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+\-.]*)",
        r":",
        r"(?:",
        r"//",
        r"(?:",
        r"(?P<userinfo>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a-fA-F]{2})*)",
        r"@",
        r")?",
        r"(?P<host>",
        r"\[",
        r"(?:",
        rf"(?:{_H16}:){{7}}{_H16}|",
        rf"(?:{_H16}:){{1,7}}:|",
        rf"(?:{_H16}:){{1,6}}:{_H16}|",
        rf"(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|",
        rf"(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}|",
        rf"(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|",
        rf"(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}|",
        rf"{_H16}:(?::{_H16}){{1,6}}|",
        rf":(?::{_H16}){{1,7}}|",
        r"::|",
        r"v[0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+",
        r")",
        r"\]|",
        r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])|",
        r"(?:[a-zA-Z0-9\-._~!$&'()*+,;=]|%[0-9a-fA-F]{2})*",
        r")",
        r"(?::(?P<port>[0-9]*))?",
        rf"(?P<path_abempty>(?:/{_SEGMENT_CHAR}*)*)",
        r"|",
        rf"(?P<path_absolute>/(?:{_SEGMENT_CHAR}+(?:/{_SEGMENT_CHAR}*)*)?)",
        r"|",
        rf"(?P<path_rootless>{_SEGMENT_CHAR}+(?:/{_SEGMENT_CHAR}*)*)",
        r"|",
        r"(?P<path_empty>)",
        r")",
        r"(?:\?(?P<query>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*))?",
        r"(?:\#(?P<fragment>(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*))?",
    )
)


def plain(expression: str) -> str:
    """``expression`` anchored, its named groups made plain (interegular reads no names)."""
    return "^" + re.sub(r"\(\?P<\w+>", "(?:", expression) + "$"


#: The formats the pattern guard holds, each as the anchored pattern its automaton is built from.
FORMAT_PATTERNS: dict[str, str] = {
    "hostname": plain(_HOSTNAME),
    "email": plain(_EMAIL),
    "uri": plain(_URI),
}
