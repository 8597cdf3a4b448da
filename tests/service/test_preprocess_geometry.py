"""Resize and crop geometry of every resize policy, for every image side 1...1100 (issue 15 A).

``center_crop`` computed its region as ``32 / (32 / s)``, one ulp above ``s`` for 67 of the
square sides 1...1100 (49, 98, 479, 788, 1003, ...): the box started below 0 and Pillow refused
it, so a 640x479 photo got a 500. Here the arithmetic of each policy is checked for squares,
1xN and Nx1 strips and a few hundred random aspect ratios, with Pillow's own box rules, and the
preprocessor itself runs on the strips, the sides that failed and random sizes.
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import Preprocessing, load_manifest
from tests.conftest import MODEL_REPOSITORY, running_app

SIDES = range(1, 1101)
# Square sides whose centre crop for a 32x32 input failed before the fix (a sample of the 67).
FAILED_SIDES = (49, 98, 196, 392, 479, 784, 788, 1003)
_RANDOM = random.Random(15)
RANDOM_SIZES = [(_RANDOM.randint(1, 4000), _RANDOM.randint(1, 4000)) for _ in range(300)]
SIZES = (
    [(s, s) for s in SIDES]
    + [(1, s) for s in SIDES]
    + [(s, 1) for s in SIDES]
    + RANDOM_SIZES
    + [(640, 479), (479, 640), (1, 40000), (40000, 1)]
)


def _spec(**fields: object) -> Preprocessing:
    return Preprocessing(color_mode="L", mean=[0.0], std=[1.0], **fields)


# One manifest per resize policy (and crop variant), beside the committed models' own.
POLICIES = {
    "stretch": _spec(resize="stretch", size={"height": 8, "width": 8}),
    "stretch+crop": _spec(
        resize="stretch", size={"height": 256, "width": 256}, crop_size={"height": 224, "width": 224}
    ),
    "letterbox": _spec(resize="letterbox", size={"height": 128, "width": 128}),
    "letterbox-wide": _spec(resize="letterbox", size={"height": 96, "width": 160}),
    "center_crop": _spec(resize="center_crop", size={"height": 32, "width": 32}),
    "center_crop-tall": _spec(resize="center_crop", size={"height": 40, "width": 24}),
    "shortest_edge": _spec(resize="shortest_edge", shortest_edge=800, longest_edge=1333),
    "shortest_edge-uncapped": _spec(resize="shortest_edge", shortest_edge=224),
    "shortest_edge+crop": _spec(resize="shortest_edge", shortest_edge=256, crop_size={"height": 224, "width": 224}),
    **{
        name: load_manifest(MODEL_REPOSITORY / name / "1" / "model.json").preprocessing
        for name in ("vit-digits", "vit-cifar10", "detr-digits")
    },
}


def _output_hw(preprocessor: Preprocessor, width: int, height: int) -> tuple[int, int]:
    """(H, W) the preprocessor must return for a ``width`` x ``height`` image."""
    spec = preprocessor.spec
    if spec.crop_size is not None:
        return spec.crop_size.height, spec.crop_size.width
    if preprocessor.size is not None:
        return preprocessor.size[1], preprocessor.size[0]
    content_w, content_h = preprocessor.content_size(width, height)
    return content_h, content_w


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_size_gets_a_box_pillow_accepts_and_a_whole_pixel_size(policy: str) -> None:
    preprocessor = Preprocessor(POLICIES[policy])
    for width, height in SIZES:
        content_w, content_h = preprocessor.content_size(width, height)
        assert isinstance(content_w, int) and isinstance(content_h, int), (width, height)
        assert content_w >= 1 and content_h >= 1, (width, height)
        if preprocessor.size is not None and preprocessor.spec.resize == "letterbox":
            assert content_w <= preprocessor.size[0] and content_h <= preprocessor.size[1], (width, height)
        left, top, right, bottom = preprocessor.input_region(width, height)
        if preprocessor.spec.resize == "center_crop":
            # Pillow's Image.resize(box=...) rules: inside the image, not empty.
            box = (left, top, right, bottom)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height, (width, height, box)
            # The region keeps the input's aspect ratio and one side is the whole image.
            out_w, out_h = preprocessor.size
            assert right - left == width or bottom - top == height, (width, height)
            assert abs((right - left) * out_h - (bottom - top) * out_w) <= 1e-9 * max(width, height) * max(out_w, out_h)
        else:
            assert right > left and bottom > top, (width, height)


def _real_sizes() -> list[tuple[int, int]]:
    """Sizes the preprocessor really runs on in the fast suite: strips, the failing sides, random ones."""
    strips = [(1, s) for s in range(1, 1101, 7)] + [(s, 1) for s in range(1, 1101, 7)]
    failing = [(s, s) for s in FAILED_SIDES] + [(640, 479), (479, 640)]
    return strips + failing + [(w % 1200 + 1, h % 1200 + 1) for w, h in RANDOM_SIZES[:60]]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_preprocessor_runs_on_strips_failing_sides_and_random_sizes(policy: str) -> None:
    spec = POLICIES[policy]
    preprocessor = Preprocessor(spec)
    channels = 1 if spec.color_mode == "L" else 3
    for width, height in _real_sizes():
        content_w, content_h = preprocessor.content_size(width, height)
        if content_w * content_h > 2**21:  # an uncapped shortest_edge turns a 1x1100 strip into 224x246400
            continue  # (decode_and_preprocess refuses inputs over max_pixels, below)
        x = preprocessor(Image.new(spec.color_mode, (width, height), 128))
        expected = (channels, *_output_hw(preprocessor, width, height))
        assert x.dtype == np.float32 and x.shape == expected, (width, height)
        assert np.isfinite(x).all()


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_preprocessor_runs_on_every_square_side(policy: str) -> None:
    spec = POLICIES[policy]
    preprocessor = Preprocessor(spec)
    for side in SIDES:
        x = preprocessor(Image.new(spec.color_mode, (side, side), 128))
        assert x.shape[1:] == _output_hw(preprocessor, side, side), side


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), (90, 120, 200) if mode == "RGB" else 128).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_model_input_over_max_pixels_is_a_413_before_it_is_resized() -> None:
    from service.core.errors import PayloadTooLarge
    from service.pipeline.inference import decode_and_preprocess

    uncapped = Preprocessor(POLICIES["shortest_edge-uncapped"])  # 1x4000 -> (H, W) = (896000, 224) input pixels
    with pytest.raises(PayloadTooLarge, match="896000x224"):
        decode_and_preprocess(uncapped, _png(1, 4000, "L"), max_pixels=40_000_000)
    assert decode_and_preprocess(uncapped, _png(1, 100, "L"), max_pixels=40_000_000)[1].shape == (1, 22400, 224)


@pytest.mark.anyio
async def test_a_640x479_photo_is_classified_alone_and_among_others() -> None:
    async with running_app() as client:
        alone = await client.post("/v1/models/vit-cifar10/classify", files={"image": _png(640, 479)})
        files = [("image", _png(64, 64)), ("image", _png(640, 479)), ("image", _png(1003, 1003))]
        several = await client.post("/v1/models/vit-cifar10/classify", files=files)
    assert alone.status_code == 200, alone.text
    assert alone.json()["image"] == {"width": 640, "height": 479}
    results = several.json()["results"]
    assert several.status_code == 200 and [r["image"]["width"] for r in results] == [64, 640, 1003]
    assert all(len(r["predictions"]) == 5 for r in results)


@pytest.mark.anyio
async def test_an_unexpected_preprocessing_error_fails_only_its_own_image(monkeypatch) -> None:
    async with running_app() as client:
        model = client.app.state.server.repository.get("vit-digits")
        call = model.preprocessor.__class__.__call__

        def flaky(self, image):
            if image.size == (13, 13):
                raise ZeroDivisionError("a bug of ours")
            return call(self, image)

        monkeypatch.setattr(model.preprocessor.__class__, "__call__", flaky)
        files = [("image", _png(8, 8, "L")), ("image", _png(13, 13, "L")), ("image", _png(9, 9, "L"))]
        several = await client.post("/v1/models/vit-digits/classify", files=files)
        alone = await client.post("/v1/models/vit-digits/classify", files={"image": _png(13, 13, "L")})
    assert several.status_code == 200
    first, failed, last = several.json()["results"]
    assert first["predictions"] and last["predictions"]
    assert failed["status"] == 500 and failed["type"].endswith("image-processing-failed")
    assert "fault of ours" in failed["detail"] and "ZeroDivisionError" in failed["detail"]
    assert alone.status_code == 500 and alone.json()["type"].endswith("image-processing-failed")
