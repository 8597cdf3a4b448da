"""HTTP methods beside the routes: HEAD wherever GET is served, and a 405's ``Allow`` from every route of a path.

FastAPI's routes take only the methods they name, and Starlette answers a method a path lacks
with the ``Allow`` of the first route that has the path: ``PUT /metrics`` said ``Allow: HEAD``
(GET and HEAD are two routes there, for distinct OpenAPI operation ids), and ``HEAD /v1/models``
was a 405 while ``HEAD /healthz`` was a 200. RFC 9110 asks for both: HEAD is GET without the
content (Sec. 9.3.2), and a 405's ``Allow`` lists the methods the target supports (Sec. 15.5.6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi.routing import RouteContext, iter_route_contexts
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

F = TypeVar("F", bound=Callable[..., Any])


def catch_all(endpoint: F) -> F:
    """Mark a route's endpoint as a catch-all (any method, any path under a prefix): never a path's own method."""
    endpoint.__catch_all__ = True  # type: ignore[attr-defined]
    return endpoint


def route_table(routes: Sequence[BaseRoute]) -> list[RouteContext]:
    """Every route of an app (``app.router.routes``) in the order it is tried, prefixes applied.

    FastAPI keeps an included router in the app's list as one lazy entry, not its routes;
    ``fastapi.routing.iter_route_contexts`` walks them, nested routers and prefixes included.
    Read at each use, so a route added after start-up is seen.
    """
    return list(iter_route_contexts(routes))


def _first_full_match(routes: Sequence[RouteContext], scope: Scope, method: str) -> int | None:
    """The index of the first route that takes ``method`` on the scope's path, or None."""
    for index, route in enumerate(routes):
        match, _ = route.matches({**scope, "method": method})
        if match == Match.FULL:
            return index
    return None


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods an app's ``routes`` take on the scope's path, sorted; HEAD wherever GET is (:class:`HeadAsGet`).

    Empty when no route has the path. A catch-all (:func:`catch_all`) is no path's own route.
    """
    allowed: set[str] = set()
    for route in route_table(routes):
        if getattr(route.endpoint, "__catch_all__", False):
            continue
        match, _ = route.matches({**scope, "method": ""})  # no method matches: PARTIAL means the path does
        if match != Match.NONE:
            allowed |= route.methods or set()
    if "GET" in allowed:
        allowed.add("HEAD")
    return sorted(allowed)


def not_allowed(routes: Sequence[BaseRoute], scope: Scope) -> tuple[int, str, dict[str, str]]:
    """The answer to a request whose method its path does not take: (status, detail, headers).

    405 with ``Allow`` (:func:`allowed_methods`) when some route has the path; 404 when none
    but a catch-all does (TRACE on /v2/anything). The same for /v1 (as problem+json) and /v2
    (as the protocol's ``{"error"}``): the caller picks the format.
    """
    method, path = scope["method"], scope["path"]
    if allowed := ", ".join(allowed_methods(routes, scope)):
        return 405, f"{method} is not allowed on {path}; use {allowed}", {"Allow": allowed}
    return 404, f"no such endpoint: {method} {path}", {}


class HeadAsGet:
    """Serves ``HEAD`` as ``GET`` without the content, on every path whose GET route comes first.

    A HEAD request is passed on as GET when a route takes GET on its path and no route takes
    HEAD before it or with it (a route of both methods serves HEAD itself; the /v2 catch-all,
    registered last, takes any method); the response keeps its status and headers
    (``Content-Length`` included) and sends no body. Other requests pass untouched. Inside every
    middleware but the direct path's (POST only): the access log sees the HEAD (the handler, and
    the metrics it records, see a GET).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        routes = route_table(scope["app"].router.routes)
        as_get = _first_full_match(routes, scope, "GET")
        as_head = _first_full_match(routes, scope, "HEAD")
        if as_get is None or (as_head is not None and as_head <= as_get):
            await self.app(scope, receive, send)
            return

        async def without_content(message: Message) -> None:
            if message["type"] == "http.response.pathsend":  # a file by path (ASGI's extension): no file
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            elif message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_content)
