"""The direct path (service/http/direct.py): an inference request with nothing to validate is answered
past the router, by the route the router would have picked, with the same answers and errors; every
other request still takes the router."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Match

from service import tasks
from service.core.errors import BadRequest, ProblemError
from service.http.direct import DirectInference, _handler_for, direct_routes
from service.http.routes.inference import PREFIX, InferenceRoute, build_router
from tests.conftest import ROOT, running_app
from tests.service.helpers import assert_problem

pytestmark = pytest.mark.anyio

CHELSEA = (ROOT / "examples" / "chelsea.png").read_bytes()
CLASSIFY = "/v1/models/vit-cifar10/classify"


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests that reached Starlette's exception middleware (the layer above the router)."""
    paths: list[str] = []
    real = ExceptionMiddleware.__call__

    async def counting(self: ExceptionMiddleware, scope: Any, receive: Any, send: Any) -> None:
        paths.append(scope["path"])
        await real(self, scope, receive, send)

    monkeypatch.setattr(ExceptionMiddleware, "__call__", counting)
    return paths


def _post(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"", "headers": []}


def _routes_of(route: Any) -> list[Any]:
    """An entry of ``app.router.routes`` as the routes it stands for (FastAPI ≥ 0.160 keeps included routers whole)."""
    original = getattr(route, "original_router", None)
    return list(original.routes) if original is not None else [route]


def test_every_task_with_defaults_has_a_direct_route_under_its_verb() -> None:
    table = direct_routes(build_router().routes)
    assert set(table) == set(tasks.verbs())
    for verb, (route, handler) in table.items():
        assert isinstance(route, InferenceRoute)
        assert route.path == f"{PREFIX}{{name}}/{verb}"
        assert handler is route.direct and callable(handler)


async def test_the_router_would_pick_the_route_the_direct_path_answers_by() -> None:
    async with running_app() as client:
        app = client.app  # type: ignore[attr-defined]
        [direct] = [m for m in app.user_middleware if m.cls is DirectInference]
        table = direct_routes(direct.kwargs["routes"])
        for verb, (route, _) in table.items():
            scope = _post(f"{PREFIX}any-model/{verb}")
            first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
            inside = _routes_of(first)
            assert route in inside, verb
            assert [r for r in inside[: inside.index(route)] if r.matches(scope)[0] != Match.NONE] == [], verb


async def test_a_plain_request_skips_the_router_and_answers_as_the_routed_one(routed: list[str]) -> None:
    files = {"image": ("a.png", CHELSEA, "image/png")}
    async with running_app() as client:
        routed.clear()
        direct = await client.post(CLASSIFY, files=files, headers={"X-Request-ID": "direct-1"})
        assert direct.status_code == 200, direct.text
        assert routed == []
        validated = await client.post(f"{CLASSIFY}?top_k=5", files=files)  # a query string: the router
        assert routed == [CLASSIFY]
        timed = await client.post(CLASSIFY, files=files, headers={"X-Request-Timeout": "30"})
        assert routed == [CLASSIFY, CLASSIFY]
    assert validated.status_code == timed.status_code == 200
    assert direct.headers["x-request-id"] == "direct-1"  # the middlewares outside still run
    assert "total;dur=" in direct.headers["server-timing"]
    strip = lambda body: {k: v for k, v in body.items() if k != "instance"}  # noqa: E731
    assert strip(direct.json()) == strip(validated.json()) == strip(timed.json())


async def test_paths_the_route_does_not_take_still_get_the_routers_404(routed: list[str]) -> None:
    files = {"image": ("a.png", CHELSEA, "image/png")}
    async with running_app() as client:
        routed.clear()
        for path in ("/v1/models//classify", "/v1/models/vit-cifar10/classify/", "/v1/models/a/b/classify"):
            assert_problem(await client.post(path, files=files), 404)
        assert_problem(await client.post("/v1/models/vit-cifar10/no-such-verb", files=files), 404)
        assert len(routed) == 4


async def test_its_errors_are_the_problems_the_router_answers(routed: list[str]) -> None:
    files = {"image": ("a.png", CHELSEA, "image/png")}
    async with running_app() as client:
        routed.clear()
        direct = await client.post("/v1/models/no-such-model/classify", files=files, headers={"X-Request-ID": "e-1"})
        assert routed == []
        via_router = await client.post("/v1/models/no-such-model/classify?top_k=1", files=files)
        assert routed == ["/v1/models/no-such-model/classify"]
    problem = assert_problem(direct, 404)
    assert problem["instance"] == "e-1"
    assert problem["detail"] == assert_problem(via_router, 404)["detail"]


async def test_a_bug_of_ours_on_the_direct_path_is_still_the_500_problem(
    monkeypatch: pytest.MonkeyPatch, routed: list[str]
) -> None:
    from service.http.routes import inference

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(inference, "serve", broken)
    async with running_app() as client:
        routed.clear()
        response = await client.post(CLASSIFY, files={"image": ("a.png", CHELSEA, "image/png")})
        assert routed == []  # the 500 came from the direct path, not from the router's
        assert (await client.get("/readyz")).status_code == 200
    problem = assert_problem(response, 500)
    assert "simulated" not in problem["detail"]


async def test_a_root_path_takes_the_router(routed: list[str]) -> None:
    async with running_app() as client:
        app = client.app  # type: ignore[attr-defined]
        routed.clear()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {**_post("/api" + CLASSIFY), "root_path": "/api", "http_version": "1.1", "scheme": "http"}
        scope["headers"] = [(b"content-type", b"image/png"), (b"content-length", b"0")]
        await app(scope, receive, send)
        assert routed == ["/api" + CLASSIFY]
        assert sent[0]["type"] == "http.response.start" and 400 <= sent[0]["status"] < 500


def test_exceptions_find_the_handler_starlettes_middleware_would() -> None:
    def problem(*_: object) -> None: ...
    def http(*_: object) -> None: ...
    def teapot(*_: object) -> None: ...
    def catch_all(*_: object) -> None: ...

    handlers: dict[Any, Any] = {ProblemError: problem, HTTPException: http, 418: teapot, Exception: catch_all}
    assert _handler_for(handlers, BadRequest("no")) is problem  # a subclass: the first of its MRO
    assert _handler_for(handlers, HTTPException(404)) is http
    assert _handler_for(handlers, HTTPException(418)) is teapot  # by status first, as Starlette does
    assert _handler_for(handlers, RuntimeError("bug")) is None  # the server-error middleware's
    assert _handler_for({**handlers, 500: catch_all}, HTTPException(500)) is http  # 500: not a status handler
