"""The ``iri`` and ``iri-reference`` formats, checked as RFC 3987 defines them on top of URIs.

jsonschema checks these formats with the ``rfc3987-syntax`` package when it is installed, and that
package builds an Earley parser from its grammar when it is imported, in every
process that imports jsonschema (the server, each compile worker, and vLLM's engine core and
worker, which import it through Ray), so installing it made every engine start seconds slower. It
is not installed (``pyproject.toml`` lists jsonschema's other format packages instead), and the
two formats are checked here with the RFC's own construction:

- RFC 3987 writes the IRI grammar as RFC 3986's URI grammar with ``ucschar`` added wherever an
  unreserved character may stand, and ``iprivate`` added to the query only;
- the places where the URI grammar admits an unreserved character are exactly those where it
  admits a percent-encoded octet (userinfo, host name, path segments, query, fragment);
- so a string is an IRI when its non-ASCII characters are ``ucschar`` (or ``iprivate`` inside the
  query) and its mapping to a URI (RFC 3987 section 3.1: those characters percent-encoded as
  UTF-8) is a URI, which ``rfc3986-validator`` (the package jsonschema checks ``uri`` with) says.
"""

from __future__ import annotations

from urllib.parse import quote

from rfc3986_validator import validate_rfc3986

#: RFC 3987's ``ucschar``: the non-ASCII characters an IRI may hold anywhere a URI holds an
#: unreserved character (every plane's last two code points and the specials are left out).
_UCSCHAR = (
    (0xA0, 0xD7FF),
    (0xF900, 0xFDCF),
    (0xFDF0, 0xFFEF),
    *((plane << 16, (plane << 16) + 0xFFFD) for plane in range(1, 14)),
    (0xE1000, 0xEFFFD),
)
#: RFC 3987's ``iprivate``: private-use characters, allowed in the query only.
_IPRIVATE = ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))


def _within(code: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= code <= high for low, high in ranges)


def _as_uri(text: str) -> str | None:
    """``text`` with its non-ASCII characters percent-encoded (RFC 3987 section 3.1), or ``None``
    when one of them may not stand where it is."""
    query_start = text.find("?")
    fragment_start = text.find("#")
    in_query = range(0)
    if query_start != -1 and (fragment_start == -1 or query_start < fragment_start):
        in_query = range(query_start, len(text) if fragment_start == -1 else fragment_start)
    mapped: list[str] = []
    for index, char in enumerate(text):
        code = ord(char)
        if code < 0x80:
            mapped.append(char)
        elif _within(code, _UCSCHAR) or (index in in_query and _within(code, _IPRIVATE)):
            mapped.append(quote(char, safe=""))
        else:
            return None
    return "".join(mapped)


def is_iri(instance: object) -> bool:
    """jsonschema's ``iri`` format: an absolute IRI (a scheme, an optional fragment)."""
    if not isinstance(instance, str):
        return True
    uri = _as_uri(instance)
    return uri is not None and validate_rfc3986(uri, rule="URI") is not None


def is_iri_reference(instance: object) -> bool:
    """jsonschema's ``iri-reference`` format: an IRI or a relative reference."""
    if not isinstance(instance, str):
        return True
    uri = _as_uri(instance)
    return uri is not None and validate_rfc3986(uri, rule="URI_reference") is not None
