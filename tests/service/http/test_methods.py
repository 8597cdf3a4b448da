"""HEAD wherever GET is served, and a 405's ``Allow`` naming every method of the path
(service/http/methods.py; RFC 9110, Sec. 9.3.2 and 15.5.6)."""

from __future__ import annotations

import pytest

from tests.conftest import running_app

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/metrics", "GET, HEAD"),  # said "HEAD": the first of its two routes
        ("DELETE", "/healthz", "GET, HEAD"),
        ("POST", "/readyz", "GET, HEAD"),
        ("POST", "/v1/models", "GET, HEAD"),
        ("DELETE", "/v1/models/vit-digits", "GET, HEAD"),
        ("GET", "/v1/models/vit-digits/classify", "POST"),
        ("PUT", "/v2", "GET, HEAD"),
        ("GET", "/v2/models/vit-digits/infer", "POST"),
        ("TRACE", "/v2/models/vit-digits/infer", "POST"),  # a method the /v2 catch-all does not list
        ("PROPFIND", "/v1/models", "GET, HEAD"),
        ("GET", "/v2/repository/index", "POST"),  # was a 404: the repository's routes are not v2's router's
        ("DELETE", "/v2/repository/models/vit-digits/load", "POST"),
    ],
)
async def test_a_405_allows_every_method_of_the_path(method: str, path: str, allow: str) -> None:
    async with running_app() as client:
        response = await client.request(method, path)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow
    detail = response.json()["error" if path.startswith("/v2") else "detail"]  # {"error"} on /v2, problem+json else
    assert detail == f"{method} is not allowed on {path}; use {allow}"


@pytest.mark.parametrize(
    "path", ["/v1/models", "/v1/models/vit-digits", "/v2", "/v2/models/vit-digits", "/metrics", "/healthz", "/readyz"]
)
async def test_head_is_get_without_the_content(path: str) -> None:
    async with running_app() as client:
        got = await client.get(path)
        head = await client.head(path)
    assert got.status_code == head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    if "content-length" in got.headers and path != "/metrics":  # the metrics move between the two requests
        assert head.headers["content-length"] == got.headers["content-length"]


async def test_head_of_what_has_no_get_is_still_refused() -> None:
    async with running_app() as client:
        post_only = await client.head("/v1/models/vit-digits/classify")
        nowhere = await client.head("/v1/nowhere")
        v2_nowhere = await client.head("/v2/nowhere")
        traced = await client.request("TRACE", "/v2/nowhere")
    assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"
    assert nowhere.status_code == 404 and v2_nowhere.status_code == 404
    assert traced.status_code == 404 and "allow" not in traced.headers
    assert traced.json() == {"error": "no such endpoint: TRACE /v2/nowhere"}


async def test_head_as_get_sends_no_content_of_its_own() -> None:
    # httpx's ASGI transport (and uvicorn) drop a HEAD response's body themselves: the middleware's
    # own stripping is checked on the raw ASGI messages.
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from service.http.methods import HeadAsGet

    app = FastAPI()  # its routes take GET alone (Starlette's own Route would add HEAD itself)
    app.add_api_route("/text", lambda: PlainTextResponse("hello"), methods=["GET"])
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "HEAD", "path": "/text", "raw_path": b"/text", "root_path": "",
             "query_string": b"", "headers": [], "app": app}  # fmt: skip
    await HeadAsGet(app)(scope, receive, send)
    start, *bodies = sent
    assert start["status"] == 200 and (b"content-length", b"5") in start["headers"]
    assert bodies and all(m["body"] == b"" for m in bodies) and not bodies[-1].get("more_body", False)
