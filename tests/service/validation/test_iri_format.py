"""The ``iri`` formats as RFC 3987 writes them: URI syntax with ``ucschar`` where an unreserved
character may stand, ``iprivate`` in the query only (service/validation/iri_format.py)."""

from __future__ import annotations

import jsonschema
import pytest

from tokenmold.service.validation.iri_format import is_iri, is_iri_reference
from tokenmold.service.validation.json_validator import format_checker


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com/a?b=c#d",
        "https://例え.jp/ページ?q=値#節",  # host, path, query and fragment in other scripts
        "http://user:пароль@host/",  # userinfo
        "urn:isbn:978-3-16-148410-0",
        "http://[::1]:8080/x",
        "https://example.com/😀",  # a supplementary plane is ucschar too
        "https://example.com/?\ue000",  # private use, in the query
        "http://h/%E4%BE%8B",  # already percent-encoded
    ],
)
def test_iris(text: str) -> None:
    assert is_iri(text) and is_iri_reference(text)


@pytest.mark.parametrize(
    "text",
    [
        "例え.jp/ページ",  # no scheme
        "ページ:x",  # a scheme is ASCII only
        "https://example.com/\ue000",  # private use outside the query
        "https://example.com/#\ue000",  # ... the fragment too
        "https://example.com/\ufffe",  # not a character
        "https://example.com/\ufdd0",
        "https://example.com/a b",  # a space is never allowed
        "http://[::例]/",  # an IP literal is ASCII only
        "http://h:８０/",  # so is a port
        "http://h/%zz",
    ],
)
def test_not_iris(text: str) -> None:
    assert not is_iri(text)


def test_references_may_be_relative() -> None:
    assert is_iri_reference("../ページ?q=値") and is_iri_reference("#節") and is_iri_reference("")
    assert not is_iri("../ページ") and not is_iri_reference("ペ ージ") and not is_iri_reference("a\ue000")
    assert is_iri(3) and is_iri_reference(None)  # formats judge strings only


def test_the_drafts_that_name_the_iri_formats_check_them() -> None:
    for draft in (jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator):
        checker = format_checker(draft)
        assert not checker.conforms("/relative", "iri") and checker.conforms("http://例え.jp", "iri")
        assert set(draft.FORMAT_CHECKER.checkers) <= set(checker.checkers)  # jsonschema's others kept
    assert "iri" not in format_checker(jsonschema.Draft4Validator).checkers
