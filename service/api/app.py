"""The FastAPI application: routers, the API key, the body limit, metrics and the error mapper."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from tokenmold.service.api import errors
from tokenmold.service.api.body import BodyLimit
from tokenmold.service.api.deps import require_api_key
from tokenmold.service.api.generation import Generation
from tokenmold.service.api.lifecycle import Gate, Lifecycle
from tokenmold.service.api.metrics import Metrics, MetricsMiddleware
from tokenmold.service.api.routers import (
    batches,
    chat,
    completions,
    files,
    health,
    metrics,
    models,
    openapi,
    playground,
    responses,
)
from tokenmold.service.api.settings import ServerSettings
from tokenmold.service.batch.manager import BatchManager
from tokenmold.service.engine.model_home import tokenmold_home
from tokenmold.service.engine.warm_up import warm_up
from tokenmold.service.request.runtime import Runtime
from tokenmold.service.store.responses import ResponseStore


def create_app(runtime: Runtime, settings: ServerSettings, lifecycle: Lifecycle | None = None) -> FastAPI:
    """An app serving ``runtime``; its engine starts with the app (on the server's event loop, which
    vLLM's output handler binds to) and stops with it. ``lifecycle`` (draining, engine death) is
    driven by ``server.py``; the app only refuses requests once it drains."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = runtime.start_engine()
        warm_s = await warm_up(runtime)
        # uvicorn's own logger: the one its --log-level configures.
        logging.getLogger("uvicorn.error").info(
            "engine started in %.1f s, warmed up in %.1f s; serving %r in %s",
            engine.start_seconds,
            warm_s,
            settings.model_name,
            engine.dtype,
        )
        app.state.batches.start()  # resumes the batches a previous run left unfinished
        try:
            yield
        finally:
            await app.state.batches.stop()
            if app.state.responses_store is not None:
                app.state.responses_store.close()
            runtime.shutdown()

    # FastAPI's own /docs and /openapi.json would bypass the API key: the document is served by a
    # router behind it instead.
    app = FastAPI(title="tokenmold", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    store = runtime.compiler.store
    counters = Metrics(
        runtime.compiler.cache_stats,
        runtime.compiler.pool_stats,
        runtime.engine_stats,
        store.stats if store is not None else lambda: None,
    )
    generation = Generation(runtime, settings, counters)
    app.state.generation = generation
    app.state.batches = BatchManager(
        app,
        settings,
        settings.batch_dir or tokenmold_home() / "batch",
        concurrency=runtime.config.engine.max_num_seqs // 2,  # the other half stays for interactive requests
    )
    app.state.responses_store = (
        ResponseStore(settings.store_dir or tokenmold_home() / "responses", settings.store_bounds)
        if settings.store
        else None
    )
    errors.install(app)
    app.include_router(health.router)
    app.include_router(playground.router)  # the page only: its API calls carry the key
    routers = (chat, completions, responses, models, metrics, openapi, files, batches)
    for router in (module.router for module in routers):
        app.include_router(
            router, dependencies=[Depends(require_api_key)], responses={401: errors.ERROR_RESPONSES[401]}
        )
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        per_path={"/v1/files": (settings.max_file_bytes, "--max-file-bytes")},
    )
    app.add_middleware(Gate, lifecycle=lifecycle or Lifecycle())
    app.add_middleware(errors.Guard)  # every unexpected exception answered (a 500, or a stream's error event)
    app.add_middleware(MetricsMiddleware, metrics=generation.metrics)  # outermost: sees every status
    return app
