"""Typed errors of the service layer (the grammar layer has its own in ``tokenmold.grammar.errors``).

Mapped to HTTP statuses and CLI exit codes in one place each (``service/api/errors.py``,
``service/cli/main.py``).
"""

from __future__ import annotations

from tokenmold.schemas.openai import ChoiceVerdict


class BadInput(Exception):
    """Anything a command-line caller got wrong: reported as one line, exit code 2. Defined here,
    with the service's other errors, not in the CLI (``service/cli/main.py``): ``serve``'s server
    and the ``batch`` and ``ray`` commands raise it too."""


class RequestError(Exception):
    """The request itself is unusable (a 4xx): too long a prompt, conflicting options."""

    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ShapeFieldError(RequestError):
    """A shape field whose value is not of its form (a structural tag that is not JSON, a schema
    that is not an object): the grammar layer's error, with its code, named by the request's field
    (the error is raised while the request is read, before the compile that names it otherwise)."""

    def __init__(self, message: str, *, code: str, param: str) -> None:
        super().__init__(message, param=param)
        self.code = code


class PromptTooLong(RequestError):
    code = "context_length_exceeded"


class BudgetTooSmall(RequestError):
    """The output budget cannot hold the shortest output the shape allows: refused before decoding,
    since the generation could only end truncated."""

    code = "budget_too_small"


class FitUnplannable(RequestError):
    """``budget: "fit"`` on a shape whose shortest completions the fitter cannot plan exactly (a
    pattern without a small automaton, a ``minProperties`` above the required members): refused
    before decoding, since fitting could not keep its promise to close within the budget."""

    code = "fit_unplannable"


class NotFound(RequestError):
    """The request names something this server does not have (a model, a stored response): a 404."""

    code = "not_found"


class ModelNotFound(NotFound):
    """The request names a model this server does not serve."""

    code = "model_not_found"


class Unaccepted(Exception):
    """A generation finished but is not accepted, and the caller asked to be refused (HTTP 422)
    rather than answered. ``verdicts`` holds the verdict of every unaccepted choice."""

    code = "unaccepted_output"

    def __init__(self, verdicts: list[ChoiceVerdict]) -> None:
        super().__init__(f"{len(verdicts)} output(s) not accepted")
        self.verdicts = verdicts


class EngineUnavailable(Exception):
    """The engine is not running (starting, failed, or shut down): a 503."""
