"""How the grammars lay out the JSON they generate: the text between items and between a key and
its value.

Answers to a JSON Schema are compact (``{"a":1,"b":[1,2]}``): the fewest tokens, and what the
output budget's floor and budget fitting price. Tool-call arguments are laid out as the model
writes them (``FLEXIBLE``: whitespace wherever JSON allows it), as vLLM's own server lets it (its
xgrammar JSON allows any whitespace): chat models were trained on calls laid out in several ways
(``{"a": 1}``, or one member per line), and forcing one layout on a model moves it off its
distribution, which costs it correct calls (measured on BFCL: docs/benchmarks.md). Under budget
fitting the plan needs one layout, so there the arguments are laid out as ``json.dumps`` writes
them by default (``ARGUMENTS``), which is also how calls are rendered back into a prompt. The
grammar and the budget-fitting plan both take the layout from here, so the plan is what the
grammar accepts.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple


class JsonLayout(NamedTuple):
    """The separators of a fixed JSON layout."""

    #: Between two items of an array or two members of an object.
    item: str
    #: Between a member's key and its value.
    key: str

    def dumps(self, value: Any) -> str:
        """``value`` written in this layout (non-ASCII characters as they are)."""
        return json.dumps(value, separators=self, ensure_ascii=False)

    @property
    def x_guidance(self) -> dict[str, Any]:
        """llguidance's JSON options (the ``x-guidance`` key of a schema) for this layout."""
        return {"whitespace_flexible": False, "item_separator": self.item, "key_separator": self.key}


#: JSON answers: no whitespace at all.
COMPACT = JsonLayout(",", ":")
#: Tool-call arguments under budget fitting, and calls rendered into a prompt: ``json.dumps``'
#: default separators.
ARGUMENTS = JsonLayout(", ", ": ")
#: llguidance's JSON options for a value laid out as the model writes it (tool-call arguments).
FLEXIBLE: dict[str, Any] = {"whitespace_flexible": True}
