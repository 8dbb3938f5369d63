"""JSON Pointer tokens (``tokenmold.grammar.json_pointer``): escaped in RFC 6901's order and read
back to the same name, whatever ``~`` and ``/`` it holds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenmold.grammar.json_pointer import pointer_to, pointer_token, read_token

NAMES = st.text(alphabet=st.sampled_from("~/01a"), max_size=8)


@given(NAMES)
def test_a_name_reads_back_from_its_token(name: str) -> None:
    token = pointer_token(name)
    assert "/" not in token
    assert read_token(token) == name


@given(st.lists(st.one_of(NAMES, st.integers(min_value=0, max_value=99)), max_size=4))
def test_a_pointer_splits_into_its_keys(keys: list[str | int]) -> None:
    written = pointer_to(keys)
    assert [read_token(t) for t in written.split("/")[1:]] == [str(k) for k in keys]


def test_tilde_one_in_a_name_is_not_read_as_a_slash() -> None:
    assert pointer_token("a~1/b") == "a~01~1b"
    assert pointer_to([]) == ""
