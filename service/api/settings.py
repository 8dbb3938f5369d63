"""Settings of the HTTP layer (the engine's and the grammar layer's are in ``RuntimeConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenmold.service.store.responses import StoreBounds


@dataclass(frozen=True)
class ServerSettings:
    """
    Parameters
    ----------
    model_name:
        The model id this server answers to (``/v1/models``, the ``model`` field of requests), and
        the one its answers name.
    model_aliases:
        More ids it answers to (``serve --served-model-name NAME ALIAS...``, as vLLM takes several):
        listed by ``/v1/models`` after ``model_name`` and accepted in a request's ``model``; answers
        still name ``model_name``, as vLLM's name its first.
    api_key:
        When set, every route except ``/health`` needs ``Authorization: Bearer <api_key>``.
    max_body_bytes:
        Largest request body; bigger ones are refused with 413 while being read, before parsing.
    reject_unaccepted:
        Answer 422 instead of 200 when an output is truncated or invalid (per request:
        the ``X-Tokenmold-Reject-Unaccepted`` header overrides it).
    batch_dir:
        Where ``/v1/files`` and ``/v1/batches`` keep their state (default ``$TOKENMOLD_HOME/batch``).
    max_file_bytes:
        Largest ``/v1/files`` upload (the other routes keep ``max_body_bytes``).
    trust_request_chat_template:
        Accept a request's own ``chat_template`` (vLLM's ``--trust-request-chat-template``): a
        template is code the server runs, in Jinja's sandbox, so it is refused unless trusted.
    store:
        Keep ``/v1/responses`` answers (unless a request says ``store: false``) for
        ``GET /v1/responses/{id}`` and ``previous_response_id``; off (``serve --no-store``), the
        server keeps nothing between requests.
    store_dir:
        Where they are kept (default ``$TOKENMOLD_HOME/responses``); replicas on one host share it.
    store_bounds:
        How long they are kept and how many bytes they may take.
    """

    model_name: str
    model_aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = 2_000_000
    reject_unaccepted: bool = False
    batch_dir: Path | None = None
    max_file_bytes: int = 200_000_000
    trust_request_chat_template: bool = False
    store: bool = True
    store_dir: Path | None = None
    store_bounds: StoreBounds = StoreBounds()

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every model id served, ``model_name`` first."""
        return (self.model_name, *self.model_aliases)
