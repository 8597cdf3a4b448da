"""The /v1 inference routes in process (httpx over ASGI): detect (detections, parameters, render=png), and
classify with ``?render=png`` or ``Accept: image/png`` (the attention-rollout picture)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.runtime.manifest import load_manifest
from service.tasks.detection import font_size
from tests.conftest import ROOT, num_queries, png_bytes, running_app, served_version
from tests.service.helpers import allowed_region, assert_problem, drawn_mask

pytestmark = pytest.mark.anyio


CANVAS = (ROOT / "examples" / "canvas.png").read_bytes()


DETECT = "/v1/models/detr-digits/detect"


def _matches(detections: list[dict], truth) -> list[int]:
    """Per detection, the index of the true object of its label it overlaps most (IoU >= 0.5), else -1."""
    found = []
    for d in detections:
        box = np.array([d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")])
        best, index = 0.5, -1
        for i, (true_box, label) in enumerate(zip(truth.boxes, truth.labels, strict=True)):
            inter = np.prod(np.clip(np.minimum(box[2:], true_box[2:]) - np.maximum(box[:2], true_box[:2]), 0, None))
            union = np.prod(box[2:] - box[:2]) + np.prod(true_box[2:] - true_box[:2]) - inter
            if str(label) == d["label"] and inter / union >= best:
                best, index = inter / union, i
        found.append(index)
    return found


async def test_detect_the_example_canvas() -> None:
    from models.detection_data import example_canvas

    truth = example_canvas()  # examples/canvas.png: the digits 2, 4, 3, 5, 0 and their boxes
    async with running_app() as client:
        response = await client.post(DETECT, files={"image": CANVAS}, headers={"X-Request-ID": "detr-1"})
        first = await client.post(DETECT, params={"version": "1"}, files={"image": CANVAS})
        low = await client.post(DETECT, params={"threshold": "0.1"}, files={"image": CANVAS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "detr-digits" and body["version"] == served_version("detr-digits").name
    assert body["image"] == {"width": 339, "height": 327}
    detections = body["detections"]
    # Version 4 (issue 21): every detection is a true digit in place, none twice, all five found. The
    # '2' cut by the bottom edge, which version 2 scored under 0.5, is in (README; docs/models.md).
    matched = _matches(detections, truth)
    assert -1 not in matched and len(set(matched)) == len(matched)
    assert sorted(d["label"] for d in detections) == ["0", "2", "3", "4", "5"]
    at_low = low.json()["detections"]
    cut = [d for d, i in zip(at_low, _matches(at_low, truth), strict=True) if i == 0]
    assert cut[0]["label"] == "2" and all(d["score"] < 0.5 for d in cut[1:])  # other labels of its box: under
    # The least sure, calibrated to about 0.75 (version 3: 0.55): the README's 0.7 picture has it.
    assert [d["label"] for d in detections if d["score"] < 0.9] == ["2"] and min(d["score"] for d in detections) > 0.7
    # Version 1 found the '2' but gave the '3' a second box: the duplicate issue 21 is about.
    old = first.json()["detections"]
    assert sorted(d["label"] for d in old) == ["0", "2", "3", "3", "4", "5"] and first.json()["version"] == "1"
    scores = [d["score"] for d in detections]
    assert scores == sorted(scores, reverse=True) and min(scores) >= 0.5
    for d in detections:
        box = d["box"]
        assert 0 <= box["xmin"] < box["xmax"] <= 339 and 0 <= box["ymin"] < box["ymax"] <= 327
        assert d["class_id"] == int(d["label"])
    assert response.headers["x-request-id"] == "detr-1" and "compute;dur=" in response.headers["server-timing"]


async def test_threshold_and_max_detections() -> None:
    async with running_app() as client:
        everything = (await client.post(DETECT + "?threshold=0", files={"image": CANVAS})).json()["detections"]
        strict = (await client.post(DETECT + "?threshold=0.999999", files={"image": CANVAS})).json()["detections"]
        top2 = (await client.post(DETECT + "?threshold=0&max_detections=2", files={"image": CANVAS})).json()
        many = (await client.post(DETECT + "?threshold=0&max_detections=100000", files={"image": CANVAS})).json()
    queries = num_queries("detr-digits")
    assert len(everything) == queries  # one per object query: DETR's set, read directly, no NMS
    assert all(d["score"] >= 0.999999 for d in strict) and len(strict) < queries
    assert top2["detections"] == everything[:2]
    assert many["detections"] == everything  # clamped to the number of queries


async def test_bad_parameters_are_422() -> None:
    queries = ["threshold=1.5", "threshold=-0.1", "threshold=nan", "threshold=abc", "max_detections=0", "render=gif"]
    queries += ["threshold=0_5", "max_detections=1_0"]  # Python's digit grouping: no client means it in a URL
    async with running_app() as client:
        for query in queries:
            response = await client.post(f"{DETECT}?{query}", files={"image": CANVAS})
            assert_problem(response, 422, query.split("=")[0])
        nan = await client.post(f"{DETECT}?threshold=nan", files={"image": CANVAS})
        assert "finite number" in nan.json()["detail"]  # not "should be less than or equal to 1"
        grouped = await client.post(f"{DETECT}?max_detections=1_0", files={"image": CANVAS})
        assert "without underscores" in grouped.json()["detail"]


async def test_render_png_draws_the_returned_boxes() -> None:
    async with running_app() as client:
        detections = (await client.post(DETECT + "?threshold=0.7", files={"image": CANVAS})).json()["detections"]
        response = await client.post(DETECT + "?threshold=0.7&render=png", files={"image": CANVAS})
        by_accept = await client.post(
            DETECT + "?threshold=0.7", files={"image": CANVAS}, headers={"Accept": "image/png"}
        )
        json_anyway = await client.post(
            DETECT + "?threshold=0.7&render=json", files={"image": CANVAS}, headers={"Accept": "image/png"}
        )
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert "compute;dur=" in response.headers["server-timing"]
    assert by_accept.headers["content-type"] == "image/png" and by_accept.content == response.content
    assert json_anyway.json()["detections"] == detections
    drawn = Image.open(io.BytesIO(response.content))
    original = Image.open(io.BytesIO(CANVAS))
    assert drawn.size == original.size == (339, 327)
    changed = drawn_mask(original, drawn)
    assert changed.sum() > 0
    assert not np.any(changed & ~allowed_region(detections, drawn.size, font_size(*drawn.size) + 6))
    for d in detections:  # every returned box is outlined where it says
        b = d["box"]
        assert changed[int((b["ymin"] + b["ymax"]) / 2), round(b["xmin"])]


async def test_render_png_takes_one_image() -> None:
    async with running_app() as client:
        response = await client.post(DETECT + "?render=png", files=[("image", CANVAS), ("image", CANVAS)])
    assert_problem(response, 400, "one image")


async def test_several_images_and_a_bad_one() -> None:
    blank = png_bytes(np.full((90, 70), 30, np.uint8))
    async with running_app() as client:
        response = await client.post(DETECT, files=[("image", CANVAS), ("image", b"nonsense"), ("image", blank)])
    assert response.status_code == 200
    first, bad, empty = response.json()["results"]
    assert {d["label"] for d in first["detections"]} == {"0", "2", "3", "4", "5"}  # as posted alone (above)
    assert bad["status"] == 415
    assert empty["image"] == {"width": 70, "height": 90} and empty["detections"] == []


async def test_tasks_are_not_mixed_up() -> None:
    async with running_app() as client:
        assert_problem(await client.post("/v1/models/vit-digits/detect", files={"image": CANVAS}), 400, "classify")
        assert_problem(await client.post("/v1/models/detr-digits/classify", files={"image": CANVAS}), 400, "detect")
        assert_problem(await client.post("/v1/models/nope/detect", files={"image": CANVAS}), 404, "nope")
        listing = (await client.get("/v1/models/detr-digits")).json()
    (version,) = [v for v in listing["versions"] if v["version"] == served_version("detr-digits").name]
    labels = load_manifest(served_version("detr-digits") / "model.json").labels
    assert version["task"] == "detection" and version["labels_count"] == len(labels)
    assert (
        version["metrics"]["test_AP"]
        == load_manifest(served_version("detr-digits") / "model.json").provenance.metrics["test_AP"]
    )
    assert 0.85 <= version["metrics"]["test_AP"] <= 1  # issue 21's bar on the digits set


async def test_the_detect_route_declares_its_json_and_png_answers() -> None:
    import jsonschema

    async with running_app() as client:
        document = (await client.get("/openapi.json")).json()
        one = (await client.post(DETECT, files={"image": CANVAS})).json()
        several = (await client.post(DETECT, files=[("image", CANVAS), ("image", b"junk")])).json()
    operation = document["paths"]["/v1/models/{name}/detect"]["post"]
    responses = operation["responses"]
    assert set(responses) == {"200", "400", "401", "404", "408", "413", "415", "422", "500", "503", "504"}
    assert set(responses["200"]["content"]) == {"application/json", "image/png"}
    parameters = {p["name"]: p["schema"] for p in operation["parameters"] if p["in"] == "query"}
    assert parameters["threshold"]["minimum"] == 0 and parameters["threshold"]["maximum"] == 1
    assert parameters["max_detections"]["minimum"] == 1 and "render" in parameters
    schema = responses["200"]["content"]["application/json"]["schema"]
    jsonschema.validate(one, schema)
    jsonschema.validate(several, schema)


CAT = (ROOT / "examples" / "chelsea.png").read_bytes()  # 451x300, CC0 (scikit-image's "chelsea")


CLASSIFY = "/v1/models/vit-cifar10/classify"


def picture(response) -> Image.Image:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert "compute;dur=" in response.headers["server-timing"]
    image = Image.open(io.BytesIO(response.content))
    assert image.format == "PNG" and image.mode == "RGB"
    return image


async def test_render_png_returns_the_heat_map_at_the_displayed_size() -> None:
    async with running_app() as client:
        as_json = await client.post(CLASSIFY, files={"image": CAT})
        by_query = await client.post(CLASSIFY + "?render=png", files={"image": CAT})
        by_accept = await client.post(CLASSIFY, files={"image": CAT}, headers={"Accept": "image/png"})
        json_wins = await client.post(CLASSIFY + "?render=json", files={"image": CAT}, headers={"Accept": "image/png"})
    body = as_json.json()
    assert body["image"] == {"width": 451, "height": 300}
    image = picture(by_query)
    assert image.size == (451, 300)
    assert by_accept.content == by_query.content
    assert json_wins.json() == body
    pixels = np.asarray(image).astype(int)
    original = np.asarray(Image.open(io.BytesIO(CAT)).convert("RGB")).astype(int)
    # Centre crop of 451x300: columns 75.5..375.5 are coloured, the sides only dimmed (x 0.35).
    assert np.abs(pixels[150, 10] - np.round(original[150, 10] * 0.35)).max() <= 1
    assert np.abs(pixels[150:, 100:350] - original[150:, 100:350]).mean() > 20


async def test_a_model_without_attention_maps_has_no_picture() -> None:
    digit = png_bytes(np.zeros((8, 8), np.uint8))
    async with running_app() as client:
        response = await client.post("/v1/models/vit-digits/classify?render=png", files={"image": digit})
        plain = await client.post("/v1/models/vit-digits/classify", files={"image": digit})
    assert_problem(response, 422, "attention")
    assert plain.status_code == 200 and plain.json()["predictions"]


async def test_picture_errors_are_problems() -> None:
    async with running_app() as client:
        two = await client.post(CLASSIFY + "?render=png", files=[("image", CAT), ("image", CAT)])
        broken = await client.post(CLASSIFY + "?render=png", files={"image": b"not an image"})
        unknown = await client.post(CLASSIFY + "?render=gif", files={"image": CAT})
    assert_problem(two, 400, "one image")
    assert_problem(broken, 415)
    assert_problem(unknown, 422, "render")


@pytest.mark.parametrize(
    ("accept", "png"),
    [
        ("image/png", True),
        ("image/png, application/json", False),  # a tie: the server's default
        ("image/png, application/json;q=0.9", True),
        ("application/json, image/png", False),
        ("application/json;q=0.5, image/png", True),
        ("IMAGE/PNG;Q=0.8, application/json;q=0.7", True),
        ("image/png;q=0, application/json", False),
        ("image/png;q=0", False),
        ("application/json, image/png;q=0.1", False),
        ("image/*", False),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8", False),
        ("", False),
    ],
)
def test_accept_asks_for_the_picture_only_when_it_prefers_png_to_json(accept: str, png: bool) -> None:
    from starlette.requests import Request

    from service.http.routes.inference import _wants_png

    request = Request({"type": "http", "headers": [(b"accept", accept.encode())] if accept else []})
    assert _wants_png(request, None) is png
