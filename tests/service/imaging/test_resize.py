"""The resize policies (service/imaging/resize.py): their registry, each policy by hand, and the geometry
of every policy for every image side 1...1100 (issue 15 A).

``center_crop`` computed its region as ``32 / (32 / s)``, one ulp above ``s`` for 67 of the
square sides 1...1100 (49, 98, 479, 788, 1003, ...): the box started below 0 and Pillow refused
it, so a 640x479 photo got a 500. Here the arithmetic of each policy is checked for squares,
1xN and Nx1 strips and a few hundred random aspect ratios, with Pillow's own box rules, and the
preprocessor itself runs on the strips, the sides that failed and random sizes.
"""

from __future__ import annotations

import ast
import io
import random

import numpy as np
import pytest
from PIL import Image

from service.core.errors import PayloadTooLarge
from service.imaging import resize
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY, ROOT, running_app

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
    from service.pipeline.decoding import decode_and_preprocess

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


def crop(width: int, height: int, interpolation: str = "box") -> Preprocessor:
    spec = Preprocessing(
        color_mode="L",
        resize="center_crop",
        size={"height": height, "width": width},
        interpolation=interpolation,
        scale=1.0,
        mean=[0.0],
        std=[1.0],
    )
    return Preprocessor(spec)


def columns(width: int, height: int) -> Image.Image:
    """An "L" image whose pixel value is twice its column index (pair means stay integers)."""
    return Image.fromarray(np.tile(2 * np.arange(width, dtype=np.uint8), (height, 1)))


def test_same_aspect_same_size_is_untouched() -> None:
    image = Image.fromarray(np.arange(16, dtype=np.uint8).reshape(4, 4))
    assert crop(4, 4)(image)[0].tolist() == np.arange(16).reshape(4, 4).tolist()


def test_a_wide_image_keeps_its_centre_columns() -> None:
    # 8x4 -> 4x4: the scale is 1 (the shorter side already fits); columns 2..5 remain.
    out = crop(4, 4)(columns(8, 4))
    assert out.shape == (1, 4, 4)
    assert out[0].tolist() == [[4, 6, 8, 10]] * 4


def test_a_larger_wide_image_is_scaled_then_cropped() -> None:
    # 16x8 -> 4x4: scale 0.5, the input covers columns 4..11, each output pixel the mean of 2x2 (box).
    out = crop(4, 4)(columns(16, 8))
    assert out[0].tolist() == [[9, 13, 17, 21]] * 4


def test_a_tall_image_keeps_its_centre_rows() -> None:
    rows = Image.fromarray(np.tile(2 * np.arange(12, dtype=np.uint8)[:, None], (1, 6)))  # 6 wide, 12 tall
    out = crop(3, 3)(rows)  # scale 0.5: rows 3..8 -> 3 rows, pairs averaged
    assert out[0, :, 0].tolist() == [7, 11, 15]


def test_input_region_by_hand() -> None:
    assert crop(32, 32).input_region(451, 300) == pytest.approx((75.5, 0.0, 375.5, 300.0))
    assert crop(32, 32).input_region(300, 451) == pytest.approx((0.0, 75.5, 300.0, 375.5))
    assert crop(4, 2).input_region(10, 10) == pytest.approx((0.0, 2.5, 10.0, 7.5))  # a non-square input
    stretch = Preprocessor(Preprocessing(color_mode="L", size={"height": 4, "width": 4}, mean=[0], std=[1]))
    assert stretch.input_region(10, 7) == (0.0, 0.0, 10.0, 7.0)


def test_the_built_in_policies_are_registered() -> None:
    assert resize.names() == ["stretch", "letterbox", "shortest_edge", "center_crop", "fit"]
    built_in = (resize.STRETCH, resize.LETTERBOX, resize.SHORTEST_EDGE, resize.CENTER_CROP, resize.FIT)
    assert [p.name for p in built_in] == resize.names()
    assert [name for name in resize.names() if resize.get(name).crops] == ["center_crop"]


def test_no_policy_name_is_spelled_in_service_outside_the_registry() -> None:
    names = set(resize.names())
    found = []
    for path in (ROOT / "service").rglob("*.py"):
        where = path.relative_to(ROOT).as_posix()
        if where == "service/imaging/resize.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert found == [], "ask service.imaging.resize (get(spec.resize)) instead:\n" + "\n".join(found)


class _Mirror(resize.ResizePolicy):
    """A toy policy: stretch, then mirror left to right (a new policy is one class and one register)."""

    name = "mirror"

    def resized(self, pre: Preprocessor, image: Image.Image, target: tuple[int, int]) -> Image.Image:
        return super().resized(pre, image, target).transpose(Image.Transpose.FLIP_LEFT_RIGHT)


@pytest.fixture
def mirror() -> resize.ResizePolicy:
    policy = resize.register(_Mirror())
    yield policy
    resize.unregister(policy.name)


def test_a_registered_policy_is_validated_and_served(mirror: resize.ResizePolicy) -> None:
    spec = Preprocessing(color_mode="L", resize="mirror", size={"height": 2, "width": 3}, mean=[0], std=[1], scale=1)
    pre = Preprocessor(spec)
    image = Image.fromarray(np.array([[1, 2, 3], [4, 5, 6]], np.uint8))
    assert pre(image)[0].tolist() == [[3, 2, 1], [6, 5, 4]]
    with pytest.raises(ValueError, match="the mirror policy needs size"):
        Preprocessing(color_mode="L", resize="mirror", mean=[0], std=[1])


def test_an_unknown_policy_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown resize policy 'squash'; registered: stretch, letterbox"):
        Preprocessing(color_mode="L", resize="squash", size={"height": 2, "width": 2}, mean=[0], std=[1])


def _letterbox(width: int = 128, height: int = 128, pad_value: int = 0) -> Preprocessor:
    spec = {"color_mode": "L", "resize": "letterbox", "size": {"height": height, "width": width}, "mean": [0.0]}
    return Preprocessor(Preprocessing.model_validate({**spec, "std": [1.0], "pad_value": pad_value}))


def test_letterbox_keeps_the_aspect_ratio_and_pads_bottom_right() -> None:
    preprocess = _letterbox(pad_value=10)
    image = Image.fromarray(np.full((50, 100), 255, dtype=np.uint8))  # 100 wide, 50 high
    assert preprocess.content_size(100, 50) == (128, 64)
    x = preprocess(image)
    assert x.shape == (1, 128, 128) and x.dtype == np.float32
    assert np.allclose(x[0, :64, :], 1.0) and np.allclose(x[0, 64:, :], 10 / 255)
    tall = preprocess(Image.fromarray(np.full((128, 64), 255, dtype=np.uint8)))  # fits as is: no resize
    assert np.allclose(tall[0, :, :64], 1.0) and np.allclose(tall[0, :, 64:], 10 / 255)


def test_box_scale_inverts_the_letterbox() -> None:
    preprocess = _letterbox()
    # 100 x 50 -> content 128 x 64: the padded frame is 128 / 128 * 100 = 100 px wide and
    # 128 / 64 * 50 = 100 px high in displayed pixels.
    assert preprocess.box_scale((100, 50), (100, 50)) == pytest.approx((100.0, 100.0))
    # The same image decoded at half size (JPEG draft) but displayed at 200 x 100.
    assert preprocess.box_scale((100, 50), (200, 100)) == pytest.approx((200.0, 200.0))
    # Rounding: 100 x 80 -> content 128 x 102 (102.4 rounded); y maps 102 input rows to 80 px.
    assert preprocess.content_size(100, 80) == (128, 102)
    assert preprocess.box_scale((100, 80), (100, 80)) == pytest.approx((100.0, 128 / 102 * 80))


def test_stretch_box_scale_is_the_displayed_size() -> None:
    spec = Preprocessing.model_validate(
        {"color_mode": "L", "size": {"height": 8, "width": 8}, "mean": [0.0], "std": [1.0]}
    )
    preprocess = Preprocessor(spec)
    assert spec.resize == "stretch" and spec.pad_value == 0  # the defaults: older manifests load unchanged
    assert preprocess.content_size(30, 20) == (8, 8)
    assert preprocess.box_scale((30, 20), (60, 40)) == (60.0, 40.0)


def test_a_strip_one_pixel_wide_keeps_a_side_of_at_least_one_pixel_under_shortest_edge() -> None:
    from PIL import Image

    from service.imaging.preprocess import Preprocessor
    from service.imaging.spec import Preprocessing

    spec = Preprocessing(
        color_mode="RGB", resize="shortest_edge", shortest_edge=800, longest_edge=1333, mean=[0.5] * 3, std=[0.5] * 3
    )
    preprocessor = Preprocessor(spec)
    assert preprocessor.content_size(40000, 1) == (1333, 1)  # (width, height); the exact arithmetic gives 0
    assert preprocessor(Image.new("RGB", (40000, 1))).shape == (3, 1, 1333)


@pytest.mark.parametrize(
    ("width", "height"), [(64, 64), (128, 90), (90, 128), (200, 50), (300, 301), (1, 500), (127, 129)]
)
def test_fit_shrinks_to_longest_edge_only_as_the_bucketed_detr_was_trained(width: int, height: int) -> None:
    from models.detr_inputs import fit

    spec = Preprocessing(color_mode="L", resize="fit", longest_edge=128, mean=[0.0], std=[1.0], scale=1 / 255)
    pixels = np.random.default_rng(width * 1000 + height).integers(0, 256, (height, width), dtype=np.uint8)
    served = Preprocessor(spec)(Image.fromarray(pixels))  # (1, h, w) float32
    trained, _ = fit(pixels)
    assert served.shape == (1, *np.asarray(trained).shape)
    np.testing.assert_array_equal(np.rint(served[0] * 255).astype(np.uint8), np.asarray(trained))  # the same pixels


def test_fit_takes_buckets_that_hold_its_longest_edge_square_and_nothing_else() -> None:
    base = {"color_mode": "L", "resize": "fit", "longest_edge": 128, "mean": [0.0], "std": [1.0]}
    spec = Preprocessing.model_validate(
        {**base, "buckets": [{"height": 96, "width": 96}, {"height": 128, "width": 128}]}
    )
    assert spec.bucket_for(90, 64) == (96, 96) and spec.bucket_for(100, 64) == (128, 128)
    with pytest.raises(ValueError, match="none holds a resized 128x128"):
        Preprocessing.model_validate({**base, "buckets": [{"height": 128, "width": 96}]})
    with pytest.raises(ValueError, match="takes only longest_edge"):
        Preprocessing.model_validate({**base, "size": {"height": 8, "width": 8}})


def test_with_buckets_every_strip_under_shortest_edge_fits_a_bucket() -> None:
    # Found in review: keep_aspect_size leaves 10x130 at 128/128 as it is (its short side rounds back
    # to 10), so the resized-bucket DETR's preprocessing gave no bucket and the request a 500.
    buckets = [{"height": 96, "width": 128}, {"height": 128, "width": 96}, {"height": 128, "width": 128}]
    spec = Preprocessing(
        color_mode="L", resize="shortest_edge", shortest_edge=128, longest_edge=128, mean=[0.0], std=[1.0],
        buckets=buckets,
    )  # fmt: skip
    unbucketed = Preprocessor(spec.model_copy(update={"buckets": None}))
    assert unbucketed.content_size(130, 10) == (130, 10)  # the Hugging Face arithmetic, kept without buckets
    preprocess = Preprocessor(spec)
    assert preprocess.content_size(130, 10) == (128, 10) and preprocess.content_size(1, 255) == (1, 128)
    for height in range(1, 300, 7):
        for width in (1, 10, 50, 64, 100, 127, 128, 129, 130, 255, 400, 1200):
            w, h = preprocess.content_size(width, height)
            assert max(w, h) <= 128 and spec.bucket_for(h, w) is not None, (width, height)
