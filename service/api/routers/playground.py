"""GET /playground: a page to try a schema on the served model (``service/api/static/``).

The page and its script are public: a browser cannot send a Bearer header when it navigates, and
they hold nothing but code. Every call the page makes (``/v1/models``, ``/v1/chat/completions``)
goes through the API key, which the user types into the page (kept in ``sessionStorage``, sent as
``Authorization: Bearer``). No build step and nothing from a CDN: the Content-Security-Policy
allows this server only.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.exceptions import HTTPException

router = APIRouter(include_in_schema=False)

_ASSETS = {
    "playground.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> Response:
    if name not in _ASSETS:
        raise HTTPException(404, f"no playground asset {name!r}")
    content = resources.files("tokenmold.service.api").joinpath("static", name).read_bytes()
    return Response(content, media_type=_ASSETS[name], headers=_HEADERS)


@router.get("/playground")
async def playground() -> Response:
    return _asset("playground.html")


@router.get("/playground/{name}")
async def playground_asset(name: str) -> Response:
    return _asset(name)
