"""The FastAPI application: routers, the API key, the body limit, metrics and the error mapper."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from service.api import errors
from service.api.body import BodyLimit
from service.api.deps import require_api_key
from service.api.generation import Generation
from service.api.metrics import Metrics, MetricsMiddleware
from service.api.routers import chat, completions, health, metrics, models, openapi
from service.api.settings import ServerSettings
from service.runtime import Runtime


def create_app(runtime: Runtime, settings: ServerSettings) -> FastAPI:
    """An app serving ``runtime``; its engine starts with the app (on the server's event loop, which
    vLLM's output handler binds to) and stops with it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = runtime.start_engine()
        # uvicorn's own logger: the one its --log-level configures.
        logging.getLogger("uvicorn.error").info(
            "engine started in %.1f s; serving %r", engine.start_seconds, settings.model_name
        )
        try:
            yield
        finally:
            runtime.shutdown()

    # FastAPI's own /docs and /openapi.json would bypass the API key: the document is served by a
    # router behind it instead.
    app = FastAPI(title="tokenmold", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    generation = Generation(runtime, settings, Metrics(runtime.compiler.cache_stats))
    app.state.generation = generation
    errors.install(app)
    app.include_router(health.router)
    for router in (chat.router, completions.router, models.router, metrics.router, openapi.router):
        app.include_router(router, dependencies=[Depends(require_api_key)], responses={401: errors.ERROR_RESPONSES[401]})
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=generation.metrics)  # outermost: sees every status
    return app
