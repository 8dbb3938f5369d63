"""Run one batch job through the HTTP app's own route, in process (no socket).

Going through the app rather than beside it means a batch line is answered exactly as the same
body sent over HTTP: the same request models, translation (``api/translate.py``), generation path
(``api/generation.py``), error bodies and status codes, and the same metrics. Every job is its own
engine request, so the engine batches whatever is in flight.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenmold.service.api.deps import REJECT_HEADER
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.batch.endpoints import ENDPOINTS
from tokenmold.service.batch.jobs import Job


@dataclass
class Outcome:
    """What one job got: the route's status and JSON body."""

    job: Job
    status_code: int
    body: dict[str, Any]
    request_id: str = field(default_factory=lambda: f"req_{uuid.uuid4().hex}")

    @property
    def ok(self) -> bool:
        return self.status_code == 200

    @property
    def statuses(self) -> list[str]:
        """The verdict of each output (none unless the request succeeded)."""
        return ENDPOINTS[self.job.url].statuses(self.body) if self.ok else []

    @property
    def output_tokens(self) -> int:
        return ENDPOINTS[self.job.url].output_tokens(self.body) if self.ok else 0

    @property
    def server_error(self) -> bool:
        """A failure of the server, not of the request: worth retrying on a later run."""
        return self.status_code >= 500


class Dispatcher:
    """Posts jobs to ``app`` (the FastAPI app of ``create_app``) as its own client."""

    def __init__(self, app: Any, settings: ServerSettings) -> None:
        self.settings = settings
        headers = {REJECT_HEADER: "false"}  # a batch line carries its verdict; it is never a 422
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        # raise_app_exceptions=False: an unexpected error is the app's 500, as a remote client sees it.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(
            transport=transport, base_url="http://tokenmold.batch", headers=headers, timeout=None
        )

    async def execute(self, job: Job) -> Outcome:
        body = job.body if "model" in job.body else {**job.body, "model": self.settings.model_name}
        response = await self._client.post(job.url, json=body)
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            message = f"the route answered {response.status_code} without a JSON object"
            answer = {"error": {"message": message, "type": "server_error", "code": "internal_error"}}
        return Outcome(job, response.status_code, answer)

    async def aclose(self) -> None:
        await self._client.aclose()
