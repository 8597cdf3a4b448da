"""The direct path of ``POST /v1/models/{name}/{verb}``: past the router to the route's handler.

A request to an inference route that has nothing to validate (no query string, no
``X-Request-Timeout``: :func:`~service.http.routes.inference.needs_validation`) is answered
by the route's direct handler (:func:`~service.http.routes.inference.direct_handler`) from
here, without the layers FastAPI puts between the middlewares and a route: Starlette's
exception middleware, FastAPI's exit-stack middleware, the router's walk over every route of
every included router, and the route's own request/response wrapper. The event loop's CPU per
request fell from 0.466 to 0.402 ms on ``vit-digits`` and from 0.502 to 0.462 ms on ``vit-cifar10``
(medians of 12 rounds each, ``python -m bench.loop_cpu`` with and without ``--router``, alternating;
bench/results/2026-12-08-direct-path/).

What those layers did for such a request is done here: the scope gets ``route``, ``endpoint``,
``path_params`` and ``router`` as the router sets them (the tracing middleware names its span
from ``scope["route"]``), and an exception with a handler in ``app.exception_handlers`` other
than the catch-all's (:func:`~service.http.problems.install_handlers`: problems, validation,
HTTP exceptions) is answered by that handler, as Starlette's exception middleware would; any
other propagates to the server-error middleware as before (its 500 problem). Every other
request, and every request while a ``root_path`` is set, takes the router as before. The
middlewares outside (request id, access log, tracing, keys, admission) see no difference. Not done
here, as the server sets neither: FastAPI's per-router body and form limits (admission and
:mod:`service.http.multipart` bound the body), and its own telemetry's route attribute.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from service.http.routes.inference import PREFIX, InferenceRoute, needs_validation

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def direct_routes(routes: Sequence[BaseRoute]) -> dict[str, tuple[InferenceRoute, Handler]]:
    """``verb`` → (route, direct handler) of each inference route in ``routes`` that has one."""
    table: dict[str, tuple[InferenceRoute, Handler]] = {}
    for route in routes:
        if isinstance(route, InferenceRoute) and route.direct is not None:
            table[route.path.rpartition("/")[2]] = (route, route.direct)
    return table


class DirectInference:
    """ASGI middleware, the innermost: answers an inference request with nothing to validate itself.

    Args:
        app: the rest of the stack (Starlette's exception middleware and the router).
        routes: the inference router's routes (:func:`~service.http.routes.inference.build_router`);
            the app factory registers no route before them that takes ``POST`` on their paths
            (tests/service/http/test_direct.py checks that the router would pick the same route).
    """

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = direct_routes(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._match(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        route, handler, name = found
        scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, {"name": name}
        app = scope["app"]
        scope.setdefault("router", app.router)
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            answer = _handler_for(app.exception_handlers, exc)
            if answer is None:
                raise
            if inspect.iscoroutinefunction(answer):
                response = await answer(request, exc)
            else:
                response = await run_in_threadpool(answer, request, exc)
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[InferenceRoute, Handler, str] | None:
        """(route, handler, model name) when ``scope`` is a ``POST`` the direct path answers, else None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not path.startswith(PREFIX):
            return None
        name, _, verb = path[len(PREFIX) :].partition("/")
        found = self.routes.get(verb)
        if found is None or not name or needs_validation(scope):
            return None  # no such verb here ("/" in it: a longer path), no name, or something to validate
        return found[0], found[1], name


def _handler_for(handlers: dict[Any, Callable[..., Any]], exc: Exception) -> Callable[..., Any] | None:
    """The exception handler Starlette's exception middleware would call for ``exc``, of ``handlers``
    (``app.exception_handlers``); None where it would call none.

    Starlette gives the keys ``500`` and ``Exception`` to the server-error middleware, the rest to
    the exception middleware, which tries an ``HTTPException``'s status code first, then the first
    class of the exception's MRO registered. (Its own default handler of ``HTTPException`` is not
    looked for: :func:`~service.http.problems.install_handlers` registers one.)
    """
    if isinstance(exc, HTTPException) and exc.status_code != 500 and exc.status_code in handlers:
        return handlers[exc.status_code]
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
