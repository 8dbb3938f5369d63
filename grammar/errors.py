"""Typed errors of the grammar layer.

Every failure that a caller can cause carries a stable ``code`` (machine readable), a precise
``message`` and, where it applies, where in the input it happened: a JSON Pointer into the schema, the
offending keyword, or a line and column in an EBNF grammar or regex. The service maps each class to an
HTTP status once (``service/api/errors.py``); nothing in this package knows about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ShapeError(Exception):
    """Base class: the caller's shape cannot be turned into a grammar."""

    message: str
    pointer: str | None = None
    keyword: str | None = None
    line: int | None = None
    column: int | None = None

    code = "invalid_shape"

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        where = []
        if self.pointer is not None:
            where.append(f"at {self.pointer or '/'}")
        if self.keyword:
            where.append(f"keyword '{self.keyword}'")
        if self.line is not None:
            where.append(f"line {self.line}" + (f", column {self.column}" if self.column else ""))
        return f"{self.message} ({'; '.join(where)})" if where else self.message

    def as_fields(self) -> dict[str, object]:
        """Constructor arguments, to rebuild the error on the other side of a process boundary."""
        return {
            "message": self.message,
            "pointer": self.pointer,
            "keyword": self.keyword,
            "line": self.line,
            "column": self.column,
        }

    def as_dict(self) -> dict[str, object]:
        """The error as plain data, for logs, verdicts and HTTP bodies."""
        return {
            "code": self.code,
            "message": str(self),
            "pointer": self.pointer,
            "keyword": self.keyword,
            "line": self.line,
            "column": self.column,
        }


class SchemaError(ShapeError):
    """The JSON Schema is malformed: not JSON, wrong keyword types, unknown types, bad $ref."""

    code = "invalid_schema"


class UnsupportedFeature(ShapeError):
    """A legal schema feature that tokenmold refuses to honour (e.g. remote $ref)."""

    code = "unsupported_feature"


class UnsatisfiableSchema(ShapeError):
    """No instance can satisfy the schema (``false``, contradictory bounds, empty enum)."""

    code = "unsatisfiable_schema"


class GrammarSyntaxError(ShapeError):
    """An EBNF grammar does not parse."""

    code = "invalid_grammar"


class RegexError(ShapeError):
    """A regular expression does not parse or uses an unsupported construct."""

    code = "invalid_regex"


class LimitExceeded(ShapeError):
    """The shape is larger than a configured limit allows; ``keyword`` names the limit."""

    code = "limit_exceeded"


class CompileTimeout(ShapeError):
    """Compilation ran past the wall-clock limit and was killed."""

    code = "compile_timeout"


class CompileFailed(ShapeError):
    """The grammar engine failed on an input that passed our own checks."""

    code = "compile_failed"


class CompileUnavailable(Exception):
    """No compile worker could finish this shape, through no fault of the shape: its worker was
    killed (out of memory, an operator), or the wait for a free worker used up the compile timeout.
    (A worker that crashes on the shape, a segfault in the engine, fails it with ``CompileFailed``.)

    Not a ``ShapeError``: the caller may retry (a 503), and it is never cached (``transient``), so
    the same shape compiles normally once the pool has healed or drained.
    """

    transient = True
    code = "compile_unavailable"
