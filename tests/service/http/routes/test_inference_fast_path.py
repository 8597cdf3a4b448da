"""The /v1 inference routes' direct handler: a request with nothing to validate skips FastAPI's solver,
and answers exactly what the validated path answers; every other request is still validated."""

from __future__ import annotations

from typing import Any

import fastapi.routing
import pytest

from tests.conftest import ROOT, running_app
from tests.service.helpers import assert_problem

pytestmark = pytest.mark.anyio

CHELSEA = (ROOT / "examples" / "chelsea.png").read_bytes()
CANVAS = (ROOT / "examples" / "canvas.png").read_bytes()


@pytest.fixture
def solved(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times FastAPI's dependency solver ran (one entry per call)."""
    calls: list[int] = []
    real = fastapi.routing.solve_dependencies

    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    return calls


def _without_instance(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "instance"}


@pytest.mark.parametrize(
    ("path", "image", "defaults"),
    [
        ("/v1/models/vit-cifar10/classify", CHELSEA, "top_k=5"),
        ("/v1/models/detr-digits/detect", CANVAS, "threshold=0.5"),
    ],
)
async def test_a_request_without_parameters_skips_the_solver_and_answers_the_same(
    solved: list[int], path: str, image: bytes, defaults: str
) -> None:
    async with running_app() as client:
        solved.clear()  # readiness polls and other routes
        direct = await client.post(path, files={"image": ("a.png", image, "image/png")})
        assert direct.status_code == 200, direct.text
        assert solved == []
        validated = await client.post(f"{path}?{defaults}", files={"image": ("a.png", image, "image/png")})
        assert validated.status_code == 200, validated.text
        assert solved == [1]
    assert _without_instance(direct.json()) == _without_instance(validated.json())
    assert direct.headers["content-type"] == validated.headers["content-type"]
    assert direct.headers["vary"] == validated.headers["vary"] == "Accept"


async def test_a_timeout_header_alone_is_still_validated(solved: list[int]) -> None:
    async with running_app() as client:
        solved.clear()
        files = {"image": ("a.png", CHELSEA, "image/png")}
        bad = await client.post("/v1/models/vit-cifar10/classify", files=files, headers={"X-Request-Timeout": "-1"})
        assert_problem(bad, 422)
        assert solved == [1]
        ok = await client.post("/v1/models/vit-cifar10/classify", files=files, headers={"X-Request-Timeout": "30"})
        assert ok.status_code == 200, ok.text
        assert solved == [1, 1]


async def test_the_direct_handler_keeps_the_routes_errors(solved: list[int]) -> None:
    async with running_app() as client:
        solved.clear()
        files = {"image": ("a.png", CHELSEA, "image/png")}
        unknown = await client.post("/v1/models/no-such-model/classify", files=files)
        assert_problem(unknown, 404)
        wrong_task = await client.post("/v1/models/vit-cifar10/detect", files={"image": ("a.png", CANVAS, "image/png")})
        assert_problem(wrong_task, 400)
        assert "classify" in wrong_task.json()["detail"]
        misnamed = {"other": ("a.png", CHELSEA, "image/png")}
        no_image = await client.post("/v1/models/vit-cifar10/classify", files=misnamed)
        assert_problem(no_image, 400)
        assert solved == []  # all three answered by the direct handler, with the validated path's problems
        picture = await client.post("/v1/models/vit-cifar10/classify", files=files, headers={"Accept": "image/png"})
        assert picture.status_code == 200
        assert picture.headers["content-type"] == "image/png"
        assert solved == []
