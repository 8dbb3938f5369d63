"""The fleet as a Ray Serve application: an ingress that reads each request and routes it by shape,
and N engine replicas, each running the app ``tokenmold serve`` runs.

    HTTP -> Ray Serve proxy -> FleetIngress -> ShapeAffinityRouter -> EngineReplica x N -> vLLM engine

Ray Serve keeps the replicas (placement, health checks, restarts, autoscaling between bounds) and
the router interface; tokenmold adds only what Ray Serve cannot know: the shape key and where a
shape is warm. Each replica holds its own engine, compile cache and workers; ``--grammar-cache-dir``
on a filesystem they all see shares compiled grammars between them and across restarts, and
``--batch-dir`` there shares ``/v1/files`` and ``/v1/batches``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from tokenmold.service.api.body import BodyLimit
from tokenmold.service.api.errors import error_response
from tokenmold.service.batch.dispatch import Dispatcher
from tokenmold.service.fleet.affinity import GENERATION_PATHS, shape_key
from tokenmold.service.fleet.batch_lines import BatchLine, LineAnswer
from tokenmold.service.fleet.forwarding import ForwardedRequest, ResponseStart, run_asgi
from tokenmold.service.fleet.known_replicas import replicas_known_here

log = logging.getLogger("tokenmold.fleet")

#: Environment variables a replica takes from the command's process (vLLM's, tokenmold's and the
#: libraries' settings); the rest of the machine's environment is the Ray worker's own.
_PASSED_ON = ("VLLM_", "TOKENMOLD_", "HF_", "TRANSFORMERS_", "TORCH", "TOKENIZERS_", "PYTHONPATH", "PYTHONWARNINGS")


@dataclass(frozen=True)
class FleetOptions:
    """How many replicas, what each holds, and how requests find them."""

    #: The parsed ``serve`` flags every replica builds its app from (``server.build_server``).
    serve_args: dict[str, Any]
    replicas: int = 1
    #: Autoscaling bounds (Ray Serve's ``min_replicas``/``max_replicas``); ``None``: fixed at ``replicas``.
    min_replicas: int | None = None
    max_replicas: int | None = None
    affinity: bool = True
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    #: Requests one replica holds at once before Ray Serve routes elsewhere (the engine's batch and
    #: as many again waiting in its queue).
    max_ongoing_requests: int = 128
    environment: dict[str, str] = field(default_factory=dict)


def passed_on_environment() -> dict[str, str]:
    """The variables of this process that every replica should see (``_PASSED_ON``)."""
    return {name: value for name, value in os.environ.items() if name.startswith(_PASSED_ON)}


@serve.deployment(health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=30)
class EngineReplica:
    """One engine and the whole tokenmold app; requests arrive as ``ForwardedRequest`` values."""

    async def __init__(self, serve_args: dict[str, Any]) -> None:  # type: ignore[misc]  # Ray Serve awaits it
        from tokenmold.service.api.server import build_server
        from tokenmold.service.engine.environment import configure_environment, configure_logging

        configure_logging(serve_args.get("log_level"))
        configure_environment(embedded_model=serve_args.get("model") is None)
        self._parts = build_server(argparse.Namespace(**serve_args))
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        # The app's own lifespan: engine start, warm-up, batch resumption, as under uvicorn.
        self._lifespan = self._parts.app.router.lifespan_context(self._parts.app)
        await self._lifespan.__aenter__()
        self._dispatcher = Dispatcher(self._parts.app, self._parts.app.state.generation.settings)

    async def __call__(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        async for part in run_asgi(self._parts.app, request, self._replica_id):
            yield part

    async def execute(self, line: BatchLine) -> LineAnswer:
        """One batch line through the app's route, as ``tokenmold batch`` runs it (``Dispatcher``)."""
        outcome = await self._dispatcher.execute(line.job)
        return LineAnswer(outcome.status_code, outcome.body, self._replica_id)

    async def check_health(self) -> None:
        """Ray Serve replaces a replica whose check raises: one whose engine process died."""
        if self._parts.runtime.engine_dead:
            raise RuntimeError("the engine process died")

    async def __del__(self) -> None:
        """Ray Serve's shutdown of the replica: the app's own (batches stopped, engine shut down).
        Also called after a failed ``__init__``: only what was started is stopped."""
        dispatcher, lifespan = getattr(self, "_dispatcher", None), getattr(self, "_lifespan", None)
        if dispatcher is not None:
            await dispatcher.aclose()
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)


class _Relay(Response):
    """The replica's response, sent on as it arrives: its own status and raw headers, then its
    body chunks (server-sent events stay chunked)."""

    def __init__(self, start: ResponseStart, rest: DeploymentResponseGenerator) -> None:
        self._start = start
        self._rest = rest
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self._start.status, "headers": self._start.headers})
        streaming = any(
            name.lower() == b"content-type" and value.startswith(b"text/event-stream")
            for name, value in self._start.headers
        )
        try:
            async for chunk in self._rest:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ray.exceptions.RayError as exc:  # the replica died mid-answer: say so where the format allows
            log.warning("a replica failed mid-answer: %s", type(exc).__name__)
            if streaming:
                failed = error_response(
                    500, "the replica answering this request failed; retry it", code="replica_failed"
                )
                await send({"type": "http.response.body", "body": b"data: " + failed.body + b"\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Asgi(Response):
    """An ASGI app run as the response of Ray Serve's ``__call__``: the ingress's pipeline reads
    the body itself (under the body limit) from the request Ray Serve has not read."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self.background = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
class FleetIngress:
    """Reads a request whole (under the server's body limits, as ``tokenmold serve`` enforces
    them, before anything reaches a replica), keys it by shape and hands it to a replica through
    the router."""

    def __init__(
        self, replicas: DeploymentHandle, max_body_bytes: int, max_file_bytes: int, starting_replicas: int
    ) -> None:
        self._replicas = replicas.options(stream=True)
        #: ``/health`` says ready once this ingress's router has known this many replicas (``_health``).
        self._starting_replicas = starting_replicas
        self._all_started = False
        self._app = BodyLimit(
            self._forward, max_bytes=max_body_bytes, per_path={"/v1/files": (max_file_bytes, "--max-file-bytes")}
        )

    async def __call__(self, request: Request) -> Response:
        return _Asgi(self._app)

    async def _forward(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            body = await _read_body(receive)
        except HTTPException as exc:  # BodyLimit's refusal while the body was read
            await error_response(exc.status_code, str(exc.detail), code="request_too_large")(scope, receive, send)
            return
        path = scope["path"]
        if path == "/health" and not self._all_started_here():
            unready = error_response(
                503,
                f"{replicas_known_here()} of {self._starting_replicas} replicas are ready to route to",
                code="replicas_starting",
                headers={"Retry-After": "1"},
            )
            await unready(scope, receive, send)
            return
        forwarded = ForwardedRequest(
            method=scope["method"],
            path=path,
            query_string=scope.get("query_string", b""),
            headers=list(scope["headers"]),
            body=body,
            shape_key=shape_key(path, _json_or_none(body)) if path in GENERATION_PATHS else None,
            client=tuple(scope["client"]) if scope.get("client") else None,
        )
        response = await self._answer(forwarded)
        await response(scope, receive, send)

    def _all_started_here(self) -> bool:
        """Whether every starting replica has been known to this ingress's router (then for good).

        Ray Serve marks a replica running once its engine is up and warm, and tells each router
        so a moment later; until this router knows all of them, a shape whose home is a replica it
        does not know yet goes elsewhere, is compiled cold there, and moves home later. So ``/health``
        answers 503 until the router knows every replica the fleet starts with: traffic sent as
        soon as it says ready finds each shape's home. After that a replica lost and restarted
        does not make the fleet unready: the others keep serving, and ``/health`` asks one of them.
        """
        if not self._all_started:
            self._all_started = replicas_known_here() >= self._starting_replicas
        return self._all_started

    async def _answer(self, forwarded: ForwardedRequest) -> Response:
        # A generation whose replica died before answering is sent once more (nothing reached the
        # client yet); a file upload or batch creation is not, as it may have been done.
        attempts = 2 if forwarded.path in GENERATION_PATHS else 1
        for attempt in range(attempts):
            answer = self._replicas.remote(forwarded)
            assert isinstance(answer, DeploymentResponseGenerator)  # a handle with stream=True
            try:
                start = await answer.__anext__()
            except ray.exceptions.RayError as exc:
                log.warning("replica unavailable (attempt %d): %s", attempt + 1, type(exc).__name__)
                continue
            return _Relay(start, answer)
        return error_response(
            503, "no replica could answer; retry shortly", code="replica_unavailable", headers={"Retry-After": "1"}
        )


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None  # not JSON: the replica's app answers it with its own 400


def replica_deployment(options: FleetOptions) -> Any:
    """The engine replicas alone, bound (a batch run needs no HTTP ingress)."""
    autoscaling = None
    if options.min_replicas is not None or options.max_replicas is not None:
        autoscaling = AutoscalingConfig(
            min_replicas=options.min_replicas if options.min_replicas is not None else 1,
            max_replicas=options.max_replicas if options.max_replicas is not None else options.replicas,
            initial_replicas=options.replicas,
            target_ongoing_requests=max(1, options.max_ongoing_requests // 2),
        )
    return EngineReplica.options(  # type: ignore[attr-defined]  # serve.deployment made it a Deployment
        num_replicas=None if autoscaling else options.replicas,
        autoscaling_config=autoscaling,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options={
            "num_cpus": options.cpus_per_replica,
            "num_gpus": options.gpus_per_replica,
            "runtime_env": {"env_vars": options.environment},
        },
        request_router_config=RequestRouterConfig(
            # An import path, as Ray Serve documents it: the router is imported where the handle routes.
            request_router_class="tokenmold.service.fleet.router.ShapeAffinityRouter",  # type: ignore[arg-type]
            request_router_kwargs={"affinity": options.affinity},
        ),
    ).bind(options.serve_args)


def fleet_application(options: FleetOptions) -> Any:
    """The Ray Serve application (``serve.run`` it): the ingress bound to the engine replicas."""
    ingress_actor = {"num_cpus": 0, "runtime_env": {"env_vars": options.environment}}
    limits = (options.serve_args["max_body_bytes"], options.serve_args["max_file_bytes"])
    return FleetIngress.options(  # type: ignore[attr-defined]  # serve.deployment made it a Deployment
        ray_actor_options=ingress_actor
    ).bind(replica_deployment(options), *limits, options.replicas)
