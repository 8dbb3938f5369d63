"""The one adapter between generated text and vLLM's tool parsers, which read token ids.

vLLM's tool parsers are written for the family's own tokenizer: several look their markers up as
token ids (DeepSeek's ``<｜tool▁calls▁begin｜>``, Llama's ``<|python_tag|>``), refuse to start
when the vocabulary lacks them, and count marker ids in ``current_token_ids`` while streaming;
the engine-based ones decode deltas token by token. tokenmold parses text (the same text whether
the model wrote a marker as one special token or, like the embedded SmolLM2, as plain text), so
the parsers are handed ``MarkerTokenizer``: a tokenizer of the text itself, one token per marker
and one per other character. A marker is then one token, as in the family's vocabulary, and a
text delta is the tokens a real detokenizer would have given in as many steps. No dependency
covers this: vLLM's parsers take a tokenizer, and the model's own (SmolLM2's) has none of these
markers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MarkerTokenizer:
    """A tokenizer whose tokens are ``markers`` (ids ``0..n-1``) and single characters (``n`` plus
    the code point): what vLLM's parsers need of a tokenizer (``get_vocab``, ``encode``,
    ``decode``, the special-token lists), nothing more."""

    markers: tuple[str, ...] = ()

    # The special-token lists: empty, so that engine-based parsers drop no marker as a stray
    # special token (every marker a parser knows it finds through ``get_vocab``).
    all_special_tokens: tuple[str, ...] = ()
    all_special_ids: tuple[int, ...] = ()

    def get_vocab(self) -> dict[str, int]:
        return {marker: i for i, marker in enumerate(self.markers)}

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        """Markers first (longest at a position), every other character one token."""
        ids: list[int] = []
        pos = 0
        ordered = sorted(enumerate(self.markers), key=lambda item: -len(item[1]))
        while pos < len(text):
            found = next((i for i, marker in ordered if marker and text.startswith(marker, pos)), None)
            if found is not None:
                ids.append(found)
                pos += len(self.markers[found])
            else:
                ids.append(len(self.markers) + ord(text[pos]))
                pos += 1
        return ids

    def decode(self, ids: Iterable[int] | int, skip_special_tokens: bool = False, **_: Any) -> str:
        return "".join(self._token(i) for i in ([ids] if isinstance(ids, int) else ids))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._token(i) for i in ids]

    def _token(self, token_id: int) -> str:
        return self.markers[token_id] if token_id < len(self.markers) else chr(token_id - len(self.markers))

    def __len__(self) -> int:
        return len(self.markers) + 0x110000
