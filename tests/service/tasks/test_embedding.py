"""Embeddings (``POST /v1/models/{name}/embed``, and the ``embedding`` output over v2) on the committed vit-digits."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.imaging.preprocess import Preprocessor
from service.pipeline.decoding import decode_and_preprocess
from service.runtime.manifest import load_manifest
from service.tasks.embedding import embed
from tests.conftest import MODEL_REPOSITORY, ROOT, png_bytes, running_app
from tests.service.image_fixtures import with_orientation

pytestmark = pytest.mark.anyio

EMBED = "/v1/models/vit-digits/embed"
INFER = "/v2/models/vit-digits/infer"
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
MANIFEST = load_manifest(MODEL_REPOSITORY / "vit-digits" / "1" / "model.json")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rotated_copy(data: bytes, orientation: int = 6) -> bytes:
    """The same picture, stored rotated with an EXIF orientation that shows it upright (lossless TIFF)."""
    displayed = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    return with_orientation(displayed, orientation, "TIFF")


def test_embed_normalises_and_keeps_a_zero_vector() -> None:
    assert embed(np.array([3.0, 4.0], np.float32)) == pytest.approx([0.6, 0.8])
    assert embed(np.array([3.0, 4.0], np.float32), normalize=False) == [3.0, 4.0]
    assert embed(np.zeros(3, np.float32)) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one embedding"):
        embed(np.zeros((2, 3), np.float32))


async def test_an_image_and_its_exif_rotated_copy_embed_alike_over_http_and_v2() -> None:
    rotated = rotated_copy(DIGIT_7)
    assert rotated != DIGIT_7
    preprocessor = Preprocessor(MANIFEST.preprocessing)
    tensors = np.stack([decode_and_preprocess(preprocessor, d, 10**8)[1] for d in (DIGIT_7, rotated)])  # (2, 1, 8, 8)
    document = {
        "inputs": [
            {"name": "pixel_values", "datatype": "FP32", "shape": list(tensors.shape), "data": tensors.ravel().tolist()}
        ],
        "outputs": [{"name": "embedding", "parameters": {"binary_data": False}}],
    }
    async with running_app() as client:
        upright = (await client.post(EMBED, files={"image": DIGIT_7})).json()
        turned = (await client.post(EMBED, files={"image": rotated})).json()
        raw = (await client.post(EMBED + "?normalize=false", files={"image": DIGIT_7})).json()
        v2 = (await client.post(INFER, json=document)).json()
        metadata = (await client.get("/v2/models/vit-digits")).json()
        described = (await client.get("/v1/models/vit-digits")).json()
    dimensions = upright["dimensions"]
    assert dimensions == len(upright["embedding"]) == 32  # the ViT's hidden size
    assert upright["image"] == turned["image"] == {"width": 64, "height": 64}
    assert np.linalg.norm(upright["embedding"]) == pytest.approx(1.0, abs=1e-5)
    assert cosine(upright["embedding"], turned["embedding"]) >= 0.999
    assert np.linalg.norm(raw["embedding"]) > 1.5  # the raw LayerNorm output, not unit length
    assert np.allclose(np.asarray(raw["embedding"]) / np.linalg.norm(raw["embedding"]), upright["embedding"], atol=1e-6)
    (output,) = v2["outputs"]
    assert output["name"] == "embedding" and output["shape"] == [2, dimensions]
    rows = np.asarray(output["data"], np.float32).reshape(2, dimensions)
    assert cosine(rows[0], rows[1]) >= 0.999
    assert np.allclose(rows[0], raw["embedding"], atol=1e-5)  # v2 gives the raw vector, as the graph outputs it
    assert {"name": "embedding", "datatype": "FP32", "shape": [-1, dimensions]} in metadata["outputs"]
    assert described["versions"][0]["serves"] == ["classify", "embed"]


async def test_on_the_digits_test_split_same_class_pairs_are_closer(digits_test_split) -> None:
    images, labels = digits_test_split.images, digits_test_split.labels
    vectors = []
    async with running_app() as client:
        for start in range(0, len(images), 16):
            files = [("image", png_bytes(p)) for p in images[start : start + 16]]
            body = (await client.post(EMBED, files=files)).json()
            vectors.extend(r["embedding"] for r in body["results"])
    x = np.asarray(vectors, np.float64)  # (N, D), unit rows
    assert x.shape == (len(labels), 32)
    similarity = x @ x.T  # (N, N) cosines
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    same_mean = similarity[same & off_diagonal].mean()
    different_mean = similarity[~same].mean()
    assert same_mean > different_mean + 0.2, (same_mean, different_mean)
    # And per class: each digit's own pairs are closer than its pairs with other digits.
    for digit in range(10):
        rows = labels == digit
        assert (
            similarity[np.ix_(rows, rows)][~np.eye(rows.sum(), dtype=bool)].mean()
            > similarity[np.ix_(rows, ~rows)].mean()
        )


async def test_embed_is_refused_by_a_model_without_an_embedding_output() -> None:
    async with running_app() as client:
        response = await client.post("/v1/models/detr-digits/embed", files={"image": DIGIT_7})
        # vit-cifar10 version 1 was exported before the embedding output (version 2, DeiT, has one)
        cifar = await client.post("/v1/models/vit-cifar10/embed?version=1", files={"image": DIGIT_7})
    assert response.status_code == 400 and "no embedding output" in response.json()["detail"]
    assert "POST to /v1/models/detr-digits/detect" in response.json()["detail"]
    assert cifar.status_code == 400 and "POST to /v1/models/vit-cifar10/classify" in cifar.json()["detail"]


async def test_render_png_on_embed_is_a_400_not_ignored() -> None:
    # Found by a fresh user: ?render=png on embed answered JSON without a word.
    async with running_app() as client:
        png = await client.post(EMBED, params={"render": "png"}, files={"image": DIGIT_7})
        as_json = await client.post(EMBED, params={"render": "json"}, files={"image": DIGIT_7})
    assert png.status_code == 400 and png.headers["content-type"] == "application/problem+json"
    assert "embed draws no picture (render=png is for classify, detect)" in png.json()["detail"]
    assert as_json.status_code == 200 and len(as_json.json()["embedding"]) == 32
