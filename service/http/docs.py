"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served with no network.

FastAPI's own pages load Swagger UI and ReDoc from jsDelivr, ReDoc's fonts from Google Fonts
and the favicon from fastapi.tiangolo.com, so on an offline machine they are blank. Here the
pages load the copies that the ``fastapi-offline`` package ships (Swagger UI, Apache-2.0; ReDoc,
MIT; the package itself MIT), from ``/docs/static/``, with Swagger's online validator badge off
(it would fetch an image from validator.swagger.io) and ReDoc's footer logo, the one file its
bundle fetches from a CDN (cdn.redoc.ly), pointed at the local favicon instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response

STATIC_URL = "/docs/static"
ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
_MEDIA_TYPES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
_REDOC = "redoc.standalone.js"
# Files of public packages, holding no data: served without an API key, so that adding /docs,
# /redoc and /openapi.json to PATCHSERVE_AUTH_PUBLIC_PATHS is all it takes to browse the docs.
PUBLIC_PATHS: tuple[str, ...] = tuple(f"{STATIC_URL}/{name}" for name in (*_MEDIA_TYPES, _REDOC))
_REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


@functools.cache
def _redoc_bundle() -> bytes:
    """ReDoc's bundle with its one CDN URL (the footer logo) replaced by the local favicon."""
    return (ASSETS / _REDOC).read_bytes().replace(_REDOC_CDN_LOGO, f"{STATIC_URL}/favicon.png".encode())


def install_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Add the offline ``docs_url`` and ``redoc_url`` pages and their assets to ``app``.

    Build ``app`` with ``docs_url=None, redoc_url=None`` so FastAPI's CDN pages are not added too.
    """
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or f"{docs_url}/oauth2-redirect"

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        # request.app, not the enclosing app: FastAPI caches endpoints process-wide (an lru_cache in
        # fastapi.dependencies.models), so a closure over the app kept every app built alive.
        app = request.app
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect_url}",
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
        )

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{request.app.title} - ReDoc",
            redoc_js_url=f"{root}{STATIC_URL}/{_REDOC}",
            redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )

    @app.get(STATIC_URL + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name == _REDOC:
            return Response(_redoc_bundle(), media_type="text/javascript")
        if name not in _MEDIA_TYPES:
            raise HTTPException(404, f"the docs have no file {name!r}")
        return FileResponse(ASSETS / name, media_type=_MEDIA_TYPES[name])
