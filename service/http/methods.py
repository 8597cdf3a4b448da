"""HTTP methods beside the routes: HEAD wherever GET is served, and a 405's ``Allow`` from every route of a path.

FastAPI's routes take only the methods they name, and Starlette answers a method a path lacks
with the ``Allow`` of the first route that has the path: ``PUT /metrics`` said ``Allow: HEAD``
(GET and HEAD are two routes there, for distinct OpenAPI operation ids), and ``HEAD /v1/models``
was a 405 while ``HEAD /healthz`` was a 200. RFC 9110 asks for both: HEAD is GET without the
content (Sec. 9.3.2), and a 405's ``Allow`` lists the methods the target supports (Sec. 15.5.6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fastapi import APIRouter
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

F = TypeVar("F", bound=Callable[..., Any])


def catch_all(endpoint: F) -> F:
    """Mark a route's endpoint as a catch-all (any method, any path under a prefix): never a path's own method."""
    endpoint.__catch_all__ = True  # type: ignore[attr-defined]
    return endpoint


def _is_catch_all(route: BaseRoute) -> bool:
    return bool(getattr(getattr(route, "endpoint", None), "__catch_all__", False))


def route_table(app_routes: Iterable[BaseRoute], routers: Iterable[APIRouter]) -> list[BaseRoute]:
    """Every route of an app in the order it is tried, for :func:`allowed_methods` and :class:`HeadAsGet`.

    FastAPI keeps an included router in the app's list as one lazy entry, not its routes: this
    is the app's own routes (those with a ``path``: docs, OpenAPI) followed by the routes of
    ``routers``, in the order they were included.
    """
    own = [route for route in app_routes if getattr(route, "path", None) is not None]
    return own + [route for router in routers for route in router.routes]


def _first_full_match(routes: Iterable[BaseRoute], scope: Scope, method: str) -> int | None:
    """The index of the first route that takes ``method`` on the scope's path, or None."""
    for index, route in enumerate(routes):
        match, _ = route.matches({**scope, "method": method})
        if match == Match.FULL:
            return index
    return None


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> list[str]:
    """The methods the routes take on the scope's path, sorted; HEAD wherever GET is (:class:`HeadAsGet`).

    Empty when no route has the path. A catch-all (:func:`catch_all`) is no path's own route.
    """
    allowed: set[str] = set()
    for route in routes:
        if _is_catch_all(route):
            continue
        match, _ = route.matches({**scope, "method": ""})  # no method matches: PARTIAL means the path does
        if match != Match.NONE:
            allowed |= getattr(route, "methods", None) or set()
    if "GET" in allowed:
        allowed.add("HEAD")
    return sorted(allowed)


class HeadAsGet:
    """Serves ``HEAD`` as ``GET`` without the content, on every path whose GET route comes first.

    A HEAD request is passed on as GET when a route takes GET on its path and no route takes
    HEAD before it (the /v2 catch-all, registered last, takes any method); the response keeps
    its status and headers (``Content-Length`` included) and sends no body. Other requests pass
    untouched. The innermost middleware: the access log and the metrics see the HEAD.
    """

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # :func:`route_table`

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        as_get = _first_full_match(self.routes, scope, "GET")
        as_head = _first_full_match(self.routes, scope, "HEAD")
        if as_get is None or (as_head is not None and as_head < as_get):
            await self.app(scope, receive, send)
            return

        async def without_content(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, without_content)
