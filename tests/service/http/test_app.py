"""The HTTP API in process (httpx over ASGI, lifespan running): responses and problem+json errors."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ROOT, png_bytes, running_app
from tests.service.helpers import assert_problem, digit_tensor, json_request, sample

pytestmark = pytest.mark.anyio


DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


CLASSIFY = "/v1/models/vit-digits/classify"


async def test_classify_example_digit() -> None:
    async with running_app() as client:
        response = await client.post(
            CLASSIFY, files={"image": ("digit-7.png", DIGIT_7, "image/png")}, headers={"X-Request-ID": "my-id-1"}
        )
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "vit-digits" and body["version"] == "1"
    assert body["image"] == {"width": 64, "height": 64}
    assert len(body["predictions"]) == 5
    top = body["predictions"][0]
    assert top["label"] == "7" and top["class_id"] == 7 and top["score"] > 0.9
    scores = [p["score"] for p in body["predictions"]]
    assert scores == sorted(scores, reverse=True)
    assert response.headers["x-request-id"] == "my-id-1"
    timing = response.headers["server-timing"]
    assert all(f"{name};dur=" in timing for name in ("decode", "queue", "compute", "total"))


async def test_raw_and_base64_bodies_equal_multipart() -> None:
    async with running_app() as client:
        multipart = (await client.post(CLASSIFY, files={"image": DIGIT_7})).json()
        raw = (await client.post(CLASSIFY, content=DIGIT_7, headers={"content-type": "image/png"})).json()
        octet = await client.post(CLASSIFY, content=DIGIT_7, headers={"content-type": "application/octet-stream"})
        encoded = base64.b64encode(DIGIT_7).decode()
        as_json = (await client.post(CLASSIFY, json={"images": [encoded]})).json()
        data_url = (await client.post(CLASSIFY, json={"images": ["data:image/png;base64," + encoded]})).json()
    assert multipart == raw == octet.json() == as_json == data_url


async def test_several_images_answer_in_order_and_a_bad_one_fails_alone() -> None:
    blank = png_bytes(np.zeros((8, 8), np.uint8))
    files = [("image", DIGIT_7), ("image", b"not an image"), ("image", blank)]
    async with running_app() as client:
        response = await client.post(CLASSIFY, files=files, params={"top_k": 1})
        alone = (await client.post(CLASSIFY, files={"image": blank}, params={"top_k": 1})).json()
    assert response.status_code == 200
    results = response.json()["results"]
    assert len(results) == 3
    assert results[0]["predictions"][0]["label"] == "7"
    assert results[1]["status"] == 415 and results[1]["type"].endswith("invalid-image")
    assert results[2] == alone


async def test_top_k_is_clamped_above_the_label_count() -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY, files={"image": DIGIT_7}, params={"top_k": 1000})
    predictions = response.json()["predictions"]
    assert sorted(p["class_id"] for p in predictions) == list(range(10))
    assert sum(p["score"] for p in predictions) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("top_k", ["0", "-1", "abc", "1.5", "", "1_0"])
async def test_top_k_not_an_integer_at_least_1_is_422(top_k: str) -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY + f"?top_k={top_k}", files={"image": DIGIT_7})
    assert_problem(response, 422, "top_k")


async def test_errors_are_problems() -> None:
    async with running_app() as client:
        assert_problem(await client.post("/v1/models/nope/classify", files={"image": DIGIT_7}), 404, "nope")
        assert_problem(await client.post(CLASSIFY + "?version=9", files={"image": DIGIT_7}), 404, "version")
        assert_problem(await client.post("/v1/models/..%2F..%2Fetc/classify", files={"image": DIGIT_7}), 404)
        assert_problem(await client.get("/v1/models/nope"), 404, "nope")
        assert_problem(await client.post(CLASSIFY, files={"image": b"GIF89a but not really"}), 415)
        assert_problem(
            await client.post(CLASSIFY, content=b"hello", headers={"content-type": "text/plain"}), 415, "text/plain"
        )
        assert_problem(await client.post(CLASSIFY, content=b"", headers={"content-type": "image/png"}), 400, "empty")
        assert_problem(await client.post(CLASSIFY, files={"file": DIGIT_7}), 400, "'image'")
        assert_problem(await client.post(CLASSIFY, json={"images": ["***"]}), 400, "base64")
        assert_problem(await client.post(CLASSIFY, json={"pictures": []}), 400)
        assert_problem(await client.get("/no/such/route"), 404)


async def test_body_over_the_limit_is_413() -> None:
    async with running_app(max_body_bytes=4096) as client:
        response = await client.post(CLASSIFY, content=b"\0" * 5000, headers={"content-type": "image/png"})
    assert_problem(response, 413, "4096")


async def test_models_listing_reports_provider_and_batching() -> None:
    async with running_app(max_batch_size=4) as client:
        listing = (await client.get("/v1/models")).json()
        one = (await client.get("/v1/models/vit-digits")).json()
        health = await client.get("/healthz")
        ready = await client.get("/readyz")
    (model,) = [m for m in listing["models"] if m["name"] == "vit-digits"]
    assert model == one
    version = model["versions"][-1]
    assert version["provider"] == "CPUExecutionProvider" and version["labels_count"] == 10
    assert version["input"]["height"] == 8 and version["input"]["color_mode"] == "L"
    assert version["batching"]["max_batch_size"] == 4
    # What a /v2 client must do to an image itself: the manifest's preprocessing, as written there.
    manifest = json.loads((ROOT / "model_repository" / "vit-digits" / "1" / "model.json").read_text())
    assert version["preprocessing"] == {k: v for k, v in manifest["preprocessing"].items() if v is not None}
    assert health.status_code == 200 and ready.json() == {"status": "ready"}


def test_importing_and_building_the_app_never_imports_torch() -> None:
    code = (
        "import sys; from service.http.app import create_app; from service.core.settings import Settings; "
        "create_app(Settings(model_repository='model_repository')); "
        "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


async def test_metrics_count_requests_by_outcome_and_unknown_models_share_one_label() -> None:
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        await client.post(CLASSIFY, files={"image": DIGIT_7})
        await client.post(CLASSIFY, files={"image": b"junk"})
        await client.post("/v1/models/made-up-1/classify", files={"image": DIGIT_7})
        await client.post("/v1/models/made-up-2/classify", files={"image": DIGIT_7})
        await client.post(CLASSIFY + "?top_k=0", files={"image": DIGIT_7})  # 422s are answered requests too
        await client.post("/v1/models/made-up-3/classify?top_k=abc", files={"image": DIGIT_7})
        after = (await client.get("/metrics")).text
    name = "patchserve_requests_total"

    def delta(**labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta(model="vit-digits", version="1", outcome="success") == 1
    assert delta(model="vit-digits", version="1", outcome="client_error") == 2
    assert delta(model="_unknown", outcome="client_error") == 3
    assert "made-up" not in after
    assert sample(after, "patchserve_model_info", model="vit-digits", version="1", provider="CPUExecutionProvider") == 1
    assert sample(after, "patchserve_batch_size_count", model="vit-digits") >= 1


async def test_a_request_refused_while_the_models_load_is_counted() -> None:
    # Found by an ops tester: /v1's 503 "still loading" came from a route dependency, before the
    # request was counted, so error-rate alerts missed what clients saw while a worker restarted.
    async with running_app() as client:
        state = client.app.state.server
        loaded, state.repository = state.repository, None  # as before start-up has loaded the models
        before = (await client.get("/metrics")).text
        v1 = await client.post(CLASSIFY, files={"image": DIGIT_7})
        v2 = await client.post("/v2/models/vit-digits/infer", json=json_request(digit_tensor(DIGIT_7)))
        after = (await client.get("/metrics")).text
        state.repository = loaded
    assert_problem(v1, 503, "still loading")
    assert v2.status_code == 503 and "still loading" in v2.json()["error"]
    labels = {"model": "_unknown", "outcome": "rejected"}  # no model is known yet
    name = "patchserve_requests_total"
    assert sample(after, name, **labels) - sample(before, name, **labels) == 2


async def test_refused_parameters_are_counted_on_v2_and_under_the_version_asked_for() -> None:
    # Found by a reviewer: /v2's 400s for a bad timeout were never counted (its routes catch the
    # validation error themselves), and a /v1 422 asking for version 1 was counted on version 2.
    x = digit_tensor(DIGIT_7)
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        bad_header = await client.post(
            "/v2/models/vit-digits/infer", json=json_request(x), headers={"X-Request-Timeout": "-1"}
        )
        bad_query = await client.post("/v2/models/vit-digits/versions/1/infer?timeout=abc", json=json_request(x))
        old_version = await client.post("/v1/models/vit-cifar10/classify?version=1&top_k=0", files={"image": DIGIT_7})
        after = (await client.get("/metrics")).text
    assert bad_header.status_code == bad_query.status_code == 400 and old_version.status_code == 422

    def delta(**labels: str) -> float:
        return sample(after, "patchserve_requests_total", **labels) - sample(
            before, "patchserve_requests_total", **labels
        )

    assert delta(model="vit-digits", version="1", outcome="client_error") == 2
    assert delta(model="vit-cifar10", version="1", outcome="client_error") == 1
    assert delta(model="vit-cifar10", version="2", outcome="client_error") == 0


async def test_a_bug_of_ours_is_a_500_problem_with_headers_and_counted(monkeypatch) -> None:
    from service.tasks import classification as postprocess

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(postprocess, "classify", broken)
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        response = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers={"X-Request-ID": "bug-1"})
        after = (await client.get("/metrics")).text
        still_alive = await client.get("/readyz")
    problem = assert_problem(response, 500)
    assert problem["instance"] == "bug-1" and "simulated" not in problem["detail"]  # no internals leak
    assert "total;dur=" in response.headers["server-timing"]
    labels = {"model": "vit-digits", "version": "1", "outcome": "error"}
    name = "patchserve_requests_total"
    assert sample(after, name, **labels) - sample(before, name, **labels) == 1
    assert still_alive.status_code == 200


async def test_probes_answer_head_and_paths_are_exact() -> None:
    async with running_app() as client:
        assert (await client.head("/healthz")).status_code == 200
        assert (await client.head("/readyz")).status_code == 200
        metrics = await client.head("/metrics")  # found by a fresh user: it was a 405
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        head = await client.head("/")  # the playground page, as GET / serves it
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/html")
        assert_problem(await client.post(CLASSIFY + "/", files={"image": DIGIT_7}), 404)
        # Only ASCII digits name a version: U+0661 is an Arabic-Indic one.
        assert_problem(await client.post(CLASSIFY + "?version=%D9%A1", files={"image": DIGIT_7}), 422, "version")


async def test_a_light_digit_on_transparency_is_a_digit_on_black() -> None:
    """The digit models are trained on light ink over black: their manifests composite
    transparent pixels onto black, so a white stroke on a transparent canvas reads as drawn."""
    ink = np.asarray(Image.open(io.BytesIO(DIGIT_7)).convert("L"))
    stroke = np.zeros((*ink.shape, 4), dtype=np.uint8)
    stroke[..., :3], stroke[..., 3] = 255, ink  # white everywhere, opaque where the ink is
    async with running_app() as client:
        opaque = (await client.post(CLASSIFY, files={"image": DIGIT_7})).json()["predictions"]
        transparent = (await client.post(CLASSIFY, files={"image": png_bytes(stroke)})).json()["predictions"]
    assert transparent[0]["label"] == opaque[0]["label"] == "7"
    assert transparent[0]["score"] == pytest.approx(opaque[0]["score"], abs=0.02)


async def test_a_stopped_app_and_its_models_are_freed() -> None:
    # Found by watching the suite's memory (15 GB by its end): the docs page's endpoint closed over the
    # app, FastAPI caches endpoints process-wide, so every app built kept its sessions (~80 MB) alive.
    import gc
    import weakref

    async with running_app() as client:
        assert (await client.get("/docs")).status_code == 200
        app = weakref.ref(client.app)
        repository = weakref.ref(client.app.state.server.repository)
    del client
    gc.collect()
    assert app() is None and repository() is None
