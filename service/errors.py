"""Typed errors of the service layer (the grammar layer has its own in ``grammar.errors``).

Mapped to HTTP statuses and CLI exit codes in one place each (``service/api/errors.py``,
``service/cli.py``).
"""

from __future__ import annotations


class RequestError(Exception):
    """The request itself is unusable (a 4xx): too long a prompt, conflicting options."""

    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class PromptTooLong(RequestError):
    code = "context_length_exceeded"


class EngineUnavailable(Exception):
    """The engine is not running (starting, failed, or shut down): a 503."""
