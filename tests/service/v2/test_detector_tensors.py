"""/v2 infer on a detector with padding buckets (the served detr-digits, version 2 on), and ?version=.

A row's real pixels (all of its tensor, or the mask's top-left rectangle) are padded to the
bucket ``/v1`` pads the same resized image to, so that a tensor gets its image's answer whatever
padding the client did or did not add, and nothing larger than the largest bucket is ever run.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from prometheus_client import REGISTRY

from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest
from tests.conftest import ROOT, running_app, served_version

pytestmark = pytest.mark.anyio
DETR = "/v2/models/detr-digits/infer"
SERVED = served_version("detr-digits")  # the default version, with padding buckets
PREVIOUS = str(int(SERVED.name) - 1)  # served beside it (model_repository/detr-digits/config.json)
MANIFEST = load_manifest(SERVED / "model.json")
CANVAS = ROOT / "examples" / "canvas.png"  # 339x327 digits on black


def served(box: tuple[int, int, int, int]) -> np.ndarray:
    """The server's preprocessing of the canvas cropped to ``box``: float32 (1, h, w), unpadded."""
    with Image.open(CANVAS) as image:
        return Preprocessor(MANIFEST.preprocessing)(image.convert("L").crop(box))


def request(x: np.ndarray, mask: np.ndarray | None = None) -> dict:
    inputs = [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    if mask is not None:
        data = mask.ravel().tolist()
        inputs.append({"name": "pixel_mask", "shape": list(mask.shape), "datatype": "INT64", "data": data})
    return {"inputs": inputs}


def padded(x: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(1, C, height, width) with ``x`` top-left and 0 elsewhere, and its (1, height, width) mask."""
    values = np.zeros((1, x.shape[0], height, width), np.float32)
    values[0, :, : x.shape[1], : x.shape[2]] = x
    mask = np.zeros((1, height, width), np.int64)
    mask[0, : x.shape[1], : x.shape[2]] = 1
    return values, mask


def runs() -> float:
    """Batches the served detr-digits has run in this process."""
    labels = {"model": "detr-digits", "version": SERVED.name}
    return REGISTRY.get_sample_value("patchserve_batch_size_count", labels) or 0.0


def padded_rows() -> float:
    """Images (and /v2 rows) padded to one of its buckets in this process."""
    labels = {"model": "detr-digits", "version": SERVED.name}
    return REGISTRY.get_sample_value("patchserve_padding_fraction_count", labels) or 0.0


def outputs(response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in response.json()["outputs"]}


async def test_a_row_runs_in_its_bucket_whatever_padding_the_client_sent() -> None:
    x = served((0, 0, 339, 240))  # landscape: resized to 91x128, bucket 96x128
    assert x.shape == (1, 91, 128) and MANIFEST.preprocessing.bucket_for(91, 128) == (96, 128)
    async with running_app() as client:
        bare = outputs(await client.post(DETR, json=request(x[None])))  # no mask: every pixel real
        in_bucket = outputs(await client.post(DETR, json=request(*padded(x, 96, 128))))
        oversized = outputs(await client.post(DETR, json=request(*padded(x, 128, 128))))
        own_bucket = outputs(await client.post(DETR, json=request(*padded(x, 128, 128)[:1])))  # padding as pixels
    assert bare["pred_logits"].shape[0] == 1 and bare["pred_boxes"].shape[-1] == 4
    for other in (in_bucket, oversized):
        for name in ("pred_logits", "pred_boxes"):
            np.testing.assert_allclose(other[name], bare[name], atol=1e-5)
    # Without a mask the client's zero rows are pixels: a 128x128 image, another input, another answer.
    assert float(np.max(np.abs(own_bucket["pred_boxes"] - bare["pred_boxes"]))) > 1e-3


async def test_a_tensor_larger_than_every_bucket_is_a_400_naming_them_and_is_never_run() -> None:
    big = np.zeros((1, 1, 1024, 1024), np.float32)
    body = request(big)
    async with running_app() as client:
        response = await client.post(DETR, json=body)
        runs_before, padded_before = runs(), padded_rows()
        masked = np.zeros((1, 1024, 1024), np.int64)
        masked[0, :200, :200] = 1
        rectangle = await client.post(DETR, json=request(big, masked))
        small = await client.post(DETR, json=request(*padded(np.zeros((1, 64, 64), np.float32), 1024, 1024)))
        runs_after, padded_after = runs(), padded_rows()
    assert response.status_code == 400, response.text
    assert "1024x1024" in response.json()["error"] and "96x128, 128x96, 128x128" in response.json()["error"]
    assert rectangle.status_code == 400 and "200x200" in rectangle.json()["error"]
    # A large tensor whose mask holds a small image runs that image, in its bucket (128x128 for 64x64)
    assert small.status_code == 200, small.text
    assert runs_after == runs_before + 1 and padded_after == padded_before + 1


@pytest.mark.parametrize(
    ("path", "query", "status", "version"),
    [
        ("/v2/models/detr-digits/infer", f"?version={PREVIOUS}", 200, PREVIOUS),
        ("/v2/models/detr-digits/infer", "", 200, SERVED.name),
        ("/v2/models/detr-digits/infer", "?version=abc", 400, None),
        (f"/v2/models/detr-digits/versions/{SERVED.name}/infer", f"?version={SERVED.name}", 200, SERVED.name),
        (f"/v2/models/detr-digits/versions/{SERVED.name}/infer", f"?version=0{SERVED.name}", 200, SERVED.name),
        (f"/v2/models/detr-digits/versions/{SERVED.name}/infer", f"?version={PREVIOUS}", 400, None),
    ],
)
async def test_version_query_on_v2_infer_is_honoured_or_refused(path: str, query: str, status: int, version) -> None:
    x = np.zeros((1, 1, 128, 128), np.float32)  # every version takes 128x128 (version 1 only that)
    async with running_app() as client:
        response = await client.post(path + query, json=request(x))
    assert response.status_code == status, response.text
    if version is None:
        assert "version" in response.json()["error"]
    else:
        assert response.json()["model_version"] == version


async def test_config_shows_the_models_own_version_policy() -> None:
    async with running_app() as client:
        detr = (await client.get(f"/v2/models/detr-digits/versions/{PREVIOUS}/config")).json()
        digits = (await client.get("/v2/models/vit-digits/config")).json()
        every = (await client.get("/v2/models/detr-digits")).json()
        one = (await client.get(f"/v2/models/detr-digits/versions/{PREVIOUS}")).json()
    # model_repository/detr-digits/config.json, versions as JSON integers: Triton's ModelConfigToJson turns
    # protobuf's int64 strings back into numbers there (a fresh user's find: we wrote strings).
    assert detr["version_policy"] == {"specific": {"versions": [1, 3, 4]}}
    assert digits["version_policy"] == {"latest": {"num_versions": 1}}  # no config.json: Triton's default
    # Metadata: every served version (strings, as Triton's), or the one the path names (Triton lists only it).
    assert every["versions"] == ["1", "3", "4"] and one["versions"] == [PREVIOUS]
