"""What the model sees: decode_image's pixels for every kind of file, on known values."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.imaging.formats import HEIF_AVAILABLE
from service.imaging.images import decode_image
from tests.conftest import ROOT, png_bytes
from tests.service.image_fixtures import (
    DISPLAY,
    GENERATED,
    PILLOW_WARN_PIXELS,
    STORE,
    pattern,
    png16,
    save,
    tiff,
    with_orientation,
)

IMAGES = ROOT / "tests" / "images"


LIMIT = 40_000_000


def decode(data: bytes, mode: str = "RGB", **kwargs) -> np.ndarray:
    return np.asarray(decode_image(data, color_mode=mode, max_pixels=kwargs.pop("max_pixels", LIMIT), **kwargs).image)


def test_the_exif_tables_are_inverse() -> None:
    a = pattern()
    assert all(np.array_equal(DISPLAY[o](STORE[o](a)), a) for o in range(1, 9))
    assert len({DISPLAY[o](a).tobytes() + bytes(DISPLAY[o](a).shape) for o in range(1, 9)}) == 8  # all distinct


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF", "WEBP", "AVIF"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_shows_the_displayed_image(orientation: int, fmt: str) -> None:
    displayed = pattern()  # (32, 48): 48 wide
    decoded = decode_image(with_orientation(displayed, orientation, fmt), color_mode="L", max_pixels=LIMIT)
    assert (decoded.width, decoded.height) == (48, 32)
    pixels = np.asarray(decoded.image, np.int16)
    assert pixels.shape == displayed.shape
    tolerance = 12 if fmt in ("JPEG", "WEBP", "AVIF") else 0  # lossy codecs blur the quadrant edges a little
    assert np.abs(pixels - displayed).mean() <= tolerance / 4 and np.median(np.abs(pixels - displayed)) <= tolerance


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("Landscape_3.jpg", "Landscape_1.jpg"),
        ("Landscape_6.jpg", "Landscape_1.jpg"),
        ("Landscape_8.jpg", "Landscape_1.jpg"),
        ("Portrait_5.jpg", "Portrait_1.jpg"),
    ],
)
def test_real_rotated_photos_decode_like_the_upright_one(name: str, reference: str) -> None:
    folder = IMAGES / "exif_orientation"
    shown = decode((folder / name).read_bytes(), "L", draft_size=(64, 64)).astype(np.float32)
    upright = decode((folder / reference).read_bytes(), "L", draft_size=(64, 64)).astype(np.float32)
    assert shown.shape == upright.shape
    assert np.abs(shown - upright).mean() < 2.0  # measured 0.2-0.4; 180 degrees off measures ~80
    assert np.abs(shown[::-1, ::-1] - upright).mean() > 20.0


def test_draft_decoding_follows_the_orientation() -> None:
    stored = np.random.default_rng(0).integers(0, 255, (1600, 2400, 3), dtype=np.uint8)  # 2400 wide
    exif = Image.Exif()
    exif[0x0112] = 6
    data = save(Image.fromarray(stored), "JPEG", exif=exif)
    decoded = decode_image(data, color_mode="RGB", max_pixels=10**7, draft_size=(224, 224))
    assert (decoded.width, decoded.height) == (1600, 2400)  # displayed: turned upright
    assert decoded.image.size == (400, 600)  # DCT-scaled by 1/4, then turned


@pytest.mark.parametrize("name", ["16bit-gray.png", "16bit-gray.tif"])
def test_16bit_grayscale_is_rescaled_not_clipped(name: str) -> None:
    gradient = np.linspace(0, 65535, 64 * 48).reshape(48, 64).astype(np.uint16)
    pixels = decode(GENERATED[name]().data, "L")
    np.testing.assert_array_equal(pixels, np.rint(gradient / 257).astype(np.uint8))
    assert (pixels == 255).mean() < 0.01  # Pillow's convert("L") clips: ~99% would be 255


def test_16bit_rgb_png_and_tiff_keep_the_high_byte() -> None:
    gradient = np.linspace(0, 65535, 64 * 48).reshape(48, 64).astype(np.uint16)
    rgb16 = np.dstack([gradient, gradient // 2, gradient // 4])
    for data in (png16(rgb16), tiff(64, 48, samples=3, bits=16, data=rgb16.astype("<u2").tobytes())):
        pixels = decode(data).astype(np.int32)
        assert np.abs(pixels - rgb16 / 257).max() <= 1.0


def test_16bit_png_with_a_transparent_key_takes_the_background() -> None:
    data = (IMAGES / "pillow" / "i_trns.png").read_bytes()
    source = Image.open(io.BytesIO(data))
    transparent = np.asarray(source) == source.info["transparency"]
    assert 0 < transparent.sum() < transparent.size
    on_black = decode(data, "L", background=(0, 0, 0))
    on_white = decode(data, "L", background=(255, 255, 255))
    assert (on_black[transparent] == 0).all() and (on_white[transparent] == 255).all()
    np.testing.assert_array_equal(on_black[~transparent], on_white[~transparent])


def _grey_png_with_key(bits: int, key: int) -> tuple[bytes, np.ndarray]:
    """A 16x16 grey PNG of ``bits`` per sample whose left half is ``key`` (its tRNS colour key), right half 0."""
    samples = np.zeros((16, 16), np.uint8)
    samples[:, :8] = key
    rows = [np.packbits(np.unpackbits(row[:, None], axis=1)[:, 8 - bits :].ravel()).tobytes() for row in samples]
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))  # noqa: E731
    header = struct.pack(">IIBBBBB", 16, 16, bits, 0, 0, 0, 0)
    idat = zlib.compress(b"".join(b"\x00" + row for row in rows))
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tRNS", struct.pack(">H", key))
    return data + chunk(b"IDAT", idat) + chunk(b"IEND", b""), samples == key


@pytest.mark.parametrize(("bits", "key"), [(1, 1), (2, 3), (2, 1), (4, 15), (4, 6), (8, 200)])
def test_a_low_depth_grey_colour_key_takes_the_background(bits: int, key: int) -> None:
    # A fresh user's find: Pillow keeps a 2- or 4-bit file's key in the file's depth (3 for white in
    # 2 bits) while its pixels are scaled to 0-255, and the 1-bit mode was not composited at all.
    data, keyed = _grey_png_with_key(bits, key)
    on_black = decode(data, "L", background=(0, 0, 0))
    on_white = decode(data, "L", background=(255, 255, 255))
    assert (on_black[keyed] == 0).all() and (on_white[keyed] == 255).all()
    assert (on_black[~keyed] == 0).all() and (on_white[~keyed] == 0).all()  # the other half: opaque black


@pytest.mark.parametrize(("background", "expected"), [((255, 255, 255), (255, 255, 255)), ((0, 0, 0), (0, 0, 0))])
def test_fully_transparent_pixels_become_the_background(background, expected) -> None:
    pixels = decode(GENERATED["rgba-transparent.png"]().data, background=background)
    assert (pixels == expected).all()


def test_half_transparent_pixels_are_composited() -> None:
    pixels = decode(GENERATED["rgba-lossless.webp"]().data).astype(np.float32)  # (200, 0, 0) at alpha 128
    a = 128 / 255
    np.testing.assert_allclose(pixels[0, 0], [200 * a + 255 * (1 - a), 255 * (1 - a), 255 * (1 - a)], atol=1.5)


def test_la_and_palette_transparency_use_the_background() -> None:
    digit = np.kron(np.eye(4, dtype=np.uint8) * 255, np.ones((4, 4), np.uint8))
    la = decode(GENERATED["la.png"]().data, "L", background=(0, 0, 0))  # alpha = the digit itself
    np.testing.assert_array_equal(la, digit)
    gif = decode(GENERATED["palette-transparent.gif"]().data, background=(0, 0, 255))  # black is transparent
    assert (gif[digit == 0] == (0, 0, 255)).all() and (gif[digit == 255] == 255).all()
    palette = Image.open(IMAGES / "pillow" / "pil123p.png")
    alpha = np.asarray(palette.convert("RGBA"))[..., 3]
    shown = decode((IMAGES / "pillow" / "pil123p.png").read_bytes(), background=(0, 255, 0))
    assert (alpha == 0).any() and (shown[alpha == 0] == (0, 255, 0)).all()


@pytest.mark.parametrize("name", ["cmyk.jpg", "ycck.jpg"])
def test_cmyk_and_ycck_jpegs_become_rgb(name: str) -> None:
    pixels = decode(GENERATED[name]().data).astype(np.int32)  # C=0 M=200 Y=255 K=0
    assert pixels.shape[2] == 3
    np.testing.assert_allclose(pixels.reshape(-1, 3).mean(axis=0), [255, 55, 0], atol=6)


def test_the_committed_cmyk_jpeg_matches_pillows_rgb() -> None:
    data = (IMAGES / "pillow" / "pil_sample_cmyk.jpg").read_bytes()
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.int32)
    assert np.abs(decode(data).astype(np.int32) - expected).max() == 0


@pytest.mark.parametrize("name", ["animated.gif", "animated.webp", "stereo.mpo"])
def test_animations_and_multi_picture_files_give_their_first_frame(name: str) -> None:
    pixels = decode(GENERATED[name]().data).astype(np.int32)
    np.testing.assert_allclose(pixels.reshape(-1, 3).mean(axis=0), [255, 0, 0], atol=3)


def test_committed_animated_gif_gives_frame_zero() -> None:
    data = (IMAGES / "pillow" / "chi.gif").read_bytes()
    first = Image.open(io.BytesIO(data))
    composite = Image.alpha_composite(Image.new("RGBA", first.size, (255, 255, 255, 255)), first.convert("RGBA"))
    np.testing.assert_array_equal(decode(data), np.asarray(composite.convert("RGB")))


def test_one_bit_images_become_0_and_255() -> None:
    digit = np.kron(np.eye(4, dtype=np.uint8) * 255, np.ones((4, 4), np.uint8))
    for name in ("1bit.png", "1bit.bmp", "1bit-g4.tif"):
        np.testing.assert_array_equal(decode(GENERATED[name]().data, "L"), digit)


def test_progressive_avif_ico_and_grayscale_decode_to_their_pixels() -> None:
    displayed = pattern().astype(np.int32)
    assert np.abs(decode(GENERATED["progressive.jpg"]().data, "L").astype(np.int32) - displayed).mean() < 3
    assert np.abs(decode(GENERATED["photo.avif"]().data, "L").astype(np.int32) - displayed).mean() < 6
    icon = decode_image(GENERATED["icon.ico"]().data, color_mode="L", max_pixels=LIMIT)
    assert icon.image.size == (48, 48) and icon.format == "ICO"  # the largest icon in the file
    gray = decode((IMAGES / "pillow" / "hopper_gray.jpg").read_bytes())
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()


def test_heic_decodes_with_the_extra() -> None:
    assert HEIF_AVAILABLE
    decoded = decode_image((IMAGES / "pillow" / "hopper.heif").read_bytes(), color_mode="RGB", max_pixels=LIMIT)
    assert (decoded.width, decoded.height, decoded.format) == (128, 128, "HEIF")
    # The same picture as the committed lossless TIFF, through a lossy codec.
    tif = decode((IMAGES / "pillow" / "hopper.tif").read_bytes()).astype(np.float32)
    assert np.abs(np.asarray(decoded.image, np.float32) - tif).mean() < 12


def test_heic_without_the_extra_is_415_naming_the_format() -> None:
    code = (
        "import sys; sys.modules['pillow_heif'] = None\n"  # as if the heic extra were not installed
        "from service.imaging.formats import HEIF_AVAILABLE\n"
        "from service.imaging.images import decode_image\n"
        "from service.core.errors import InvalidImage\n"
        "assert not HEIF_AVAILABLE\n"
        "try:\n"
        "    decode_image(open('tests/images/pillow/hopper.heif', 'rb').read(), color_mode='RGB', max_pixels=10**6)\n"
        "except InvalidImage as exc:\n"
        "    print(exc.status, exc.detail)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("415 HEIC/HEIF images need the optional HEIF decoder")
    assert "patchserve[heic]" in result.stdout


def test_the_bomb_pillow_only_warns_about_is_413(monkeypatch: pytest.MonkeyPatch) -> None:
    data = GENERATED["bomb-pillow-only-warns.png"]().data
    assert len(data) < 100_000  # inflates to 90 MB
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PILLOW_WARN_PIXELS)  # Pillow's default
    with pytest.warns(Image.DecompressionBombWarning):
        assert Image.open(io.BytesIO(data)).size == (10_000, 9_000)  # Pillow alone would decode it
    with pytest.raises(PayloadTooLarge, match="90000000 pixels; the limit is 40000000"):
        decode_image(data, color_mode="L", max_pixels=LIMIT)


def test_the_pixel_limit_is_inclusive_and_exact() -> None:
    data = save(Image.new("L", (100, 50)), "PNG")
    assert decode_image(data, color_mode="L", max_pixels=5000).width == 100
    with pytest.raises(PayloadTooLarge, match="5000 pixels; the limit is 4999"):
        decode_image(data, color_mode="L", max_pixels=4999)


def test_formats_outside_the_list_never_reach_their_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import EpsImagePlugin, PpmImagePlugin

    def refuse(self) -> None:
        raise AssertionError("a plugin outside ACCEPTED_FORMATS was tried")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", refuse)
    monkeypatch.setattr(PpmImagePlugin.PpmImageFile, "_open", refuse)
    with pytest.raises(InvalidImage, match="EPS files are not accepted"):
        decode_image(GENERATED["figure.eps"]().data, color_mode="L", max_pixels=LIMIT)
    with pytest.raises(InvalidImage, match="not an image in a format this server decodes"):
        decode_image(b"P5\n8 8\n255\n" + bytes(64), color_mode="L", max_pixels=LIMIT)


def test_decode_applies_exif_orientation_and_reports_displayed_size() -> None:
    pixels = np.zeros((20, 40), dtype=np.uint8)  # stored 40 wide, 20 high
    pixels[:, :10] = 255  # white stripe on the stored left
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", exif=exif)
    decoded = decode_image(buffer.getvalue(), color_mode="L", max_pixels=10_000)
    assert (decoded.width, decoded.height) == (20, 40)
    shown = np.asarray(decoded.image)
    assert shown.shape == (40, 20)
    assert shown[:10].mean() == 255 and shown[10:].mean() == 0  # the stripe is now on top


def test_decode_converts_rgb_to_grayscale_and_back() -> None:
    rgb = np.full((4, 4, 3), (255, 0, 0), dtype=np.uint8)
    decoded = decode_image(png_bytes(rgb), color_mode="L", max_pixels=100)
    assert decoded.image.mode == "L" and np.asarray(decoded.image)[0, 0] == 76  # ITU-R 601-2 luma of pure red
    gray = np.full((4, 4), 200, dtype=np.uint8)
    assert np.asarray(decode_image(png_bytes(gray), color_mode="RGB", max_pixels=100).image)[0, 0].tolist() == [200] * 3


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", BadRequest, "empty"),
        (b"definitely not an image", InvalidImage, "not an image"),
        (png_bytes(np.zeros((64, 64), np.uint8))[:60], InvalidImage, "the PNG image is truncated"),
        (png_bytes(np.zeros((101, 100), np.uint8)), PayloadTooLarge, "10100 pixels"),
    ],
)
def test_decode_errors(data: bytes, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        decode_image(data, color_mode="L", max_pixels=10_000)


def test_jpeg_draft_mode_decodes_a_large_photo_smaller() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (1600, 2400, 3), dtype=np.uint8)).save(buffer, "JPEG")
    decoded = decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**7, draft_size=(224, 224))
    assert (decoded.width, decoded.height) == (2400, 1600)  # the full-resolution size is reported
    # DCT-scaled by 1/4 while decoding: the smallest scale that keeps both sides >= 224 (1/8 gives 300x200).
    assert decoded.image.size == (600, 400)


@pytest.mark.parametrize("size", [(451, 300), (601, 401)])
def test_a_jpeg_and_its_exif_turned_copies_score_as_the_docs_say(size: tuple[int, int]) -> None:
    """A photo whose sides are not multiples of the 8x8 block, stored in each of the eight EXIF
    orientations so that all display alike, against its PNG. Decoded at full size
    (``PATCHSERVE_SCALED_DECODE=false``) the eight give the PNG's answer (probabilities within
    0.007, embeddings at cosine 0.9999). Decoded at a DCT scale (the default) the draft lands just
    above vit-cifar10's 32x32 input (57x38, 76x51) and the 8x8 block grid's phase, which follows
    the stored orientation, moves the answer: up to 0.14 and 0.20 in a probability, cosine 0.978
    (a tester's find; docs/api.md and docs/configuration.md give these bounds). Pillow's reducing
    gap of 2 (decoding to twice the input) halved them at 451x300 but not at 803x534 (0.07), and
    cost detectors 4x the decoded pixels: not taken."""
    import onnxruntime as ort

    from service.imaging.preprocess import Preprocessor
    from service.runtime.manifest import load_manifest

    folder = ROOT / "model_repository" / "vit-cifar10" / "3"
    manifest = load_manifest(folder / "model.json")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    photo = Image.open(ROOT / "examples" / "chelsea.png").convert("RGB").resize(size, Image.Resampling.LANCZOS)

    def run(data: bytes, scaled: bool) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities, unit embedding), float64."""
        pre = Preprocessor(manifest.preprocessing, scaled_decode=scaled)
        decoded = decode_image(data, color_mode="RGB", max_pixels=10**7, draft_size=pre.draft_size)
        name = session.get_inputs()[0].name
        logits, embedding = session.run(["logits", "embedding"], {name: pre(decoded.image)[None]})
        e = np.exp(logits[0].astype(np.float64) - logits[0].max())
        return e / e.sum(), embedding[0].astype(np.float64) / np.linalg.norm(embedding[0])

    reference, reference_embedding = run(save(photo, "PNG"), scaled=False)
    stored_as = {
        1: None,
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_90,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_270,
    }
    for orientation, stored in stored_as.items():
        exif = Image.Exif()
        exif[0x0112] = orientation
        data = save(photo.transpose(stored) if stored is not None else photo, "JPEG", quality=95, exif=exif)
        full, full_embedding = run(data, scaled=False)
        assert np.abs(full - reference).max() < 0.02, orientation
        assert full_embedding @ reference_embedding >= 0.999, orientation
        scaled, scaled_embedding = run(data, scaled=True)
        assert np.abs(scaled - reference).max() < 0.25, orientation  # the bound the docs give
        assert scaled_embedding @ reference_embedding >= 0.97, orientation


def test_reading_a_png_header_decodes_no_pixel_and_its_late_exif_still_turns_it(monkeypatch) -> None:
    """Issue 14: the request path opens each file once; its header count must not decode a PNG
    (Pillow's getexif loads a PNG to find an eXIf chunk after the pixels)."""
    import io
    import struct
    import zlib

    from PIL import Image, ImageFile

    from service.imaging.images import open_image

    buffer = io.BytesIO()
    Image.new("L", (30, 20), 200).save(buffer, "PNG")
    plain = buffer.getvalue()
    exif = Image.Exif()
    exif[0x0112] = 6  # turn 90 degrees clockwise to display: 30x20 stored is 20x30 displayed
    payload = exif.tobytes()
    chunk = struct.pack(">I", len(payload)) + b"eXIf" + payload
    chunk += struct.pack(">I", zlib.crc32(b"eXIf" + payload))
    late = plain[:-12] + chunk + plain[-12:]  # eXIf after IDAT, before IEND

    loads = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(1) or real_load(self))
    opened = open_image(late, color_mode="L", max_pixels=10_000)
    assert loads == [] and opened.pixels == 600
    decoded = opened.decode((0, 0, 0))
    assert (decoded.width, decoded.height) == (20, 30) and decoded.image.size == (20, 30)
    with pytest.raises(RuntimeError, match="decoded already"):
        opened.decode((0, 0, 0))


@pytest.mark.parametrize(
    ("array", "kind", "mode"),
    [
        (np.arange(48, dtype=np.int32).reshape(6, 8) * 5, "32-bit integer", "I"),  # 0-235: was nearly black
        (np.linspace(0, 1, 48, dtype=np.float32).reshape(6, 8), "32-bit floating-point", "F"),  # was read as 0-1
    ],
    ids=["int32", "float32"],
)
def test_32bit_integer_and_float_tiffs_are_415_naming_the_mode_and_the_depths(array, kind: str, mode: str) -> None:
    # Found by a fresh user: their range is the file's own convention, so the rescale was a guess.
    out = io.BytesIO()
    Image.fromarray(array).save(out, "TIFF")
    with pytest.raises(InvalidImage, match=f"TIFF image has {kind} pixels \\(mode '{mode}'\\)") as refused:
        decode_image(out.getvalue(), color_mode="L", max_pixels=10**6)
    assert "1-, 8- and 16-bit" in str(refused.value) and refused.value.status == 415
    sixteen = io.BytesIO()
    Image.fromarray(array.astype(np.uint16) if mode == "I" else (array * 65535).astype(np.uint16)).save(sixteen, "TIFF")
    assert decode(sixteen.getvalue(), "L").shape == (6, 8)  # the same picture at 16 bits is decoded


@pytest.fixture
def parsed(monkeypatch) -> list[int]:
    """One entry for each time Pillow's EXIF parser (``Image.getexif``) runs."""
    calls: list[int] = []
    real = Image.Image.getexif
    monkeypatch.setattr(Image.Image, "getexif", lambda image: calls.append(1) or real(image))
    return calls


def _exif_of(entries: int, orientation: int = 6) -> bytes:
    """A little-endian EXIF block: the orientation, then ``entries - 1`` private SHORT tags, in its first IFD."""
    tags = [(0x0112, 3, 1, orientation)] + [(0xC000 + i % 0x3000, 3, 1, 0) for i in range(entries - 1)]
    body = struct.pack("<H", entries) + b"".join(struct.pack("<HHIHH", t, k, c, v, 0) for t, k, c, v in tags)
    return b"II*\x00" + struct.pack("<I", 8) + body + bytes(4)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_an_exif_block_of_more_entries_than_the_tiff_limit_is_not_parsed(fmt: str, parsed: list[int]) -> None:
    # A fresh user's find: 65,535 entries in a PNG's or WebP's EXIF (786 KB) cost 0.16-0.2 s of Pillow's
    # Python parser when the orientation was read; over PATCHSERVE_MAX_TIFF_TAGS (1,024) it is not read.
    # (A JPEG's EXIF is bounded by its 64 KB APP1 segment, and Pillow parses it while opening for the DPI.)
    picture = Image.new("RGB", (40, 20), (200, 10, 10))

    def saved(exif: bytes) -> bytes:
        buffer = io.BytesIO()
        picture.save(buffer, fmt, exif=exif if fmt == "PNG" else b"Exif\x00\x00" + exif)
        return buffer.getvalue()

    at_limit = decode_image(saved(_exif_of(1024)), color_mode="RGB", max_pixels=10**6)
    assert (at_limit.width, at_limit.height) == (20, 40) and parsed  # orientation 6 read: turned
    parsed.clear()
    over = decode_image(saved(_exif_of(65_535)), color_mode="RGB", max_pixels=10**6)
    assert (over.width, over.height) == (40, 20) and not parsed  # not parsed: as stored


def test_an_exif_block_in_a_text_chunk_or_with_its_ifd_in_its_header_is_counted_too(parsed: list[int]) -> None:
    # A second reviewer's: ImageMagick's "Raw profile type exif" text, which Pillow's getexif also
    # parses, and an IFD offset of 0, which Pillow follows into the header ("II" read as 18,761 entries).
    text = PngImagePlugin.PngInfo()
    exif = _exif_of(65_535)
    text.add_text("Raw profile type exif", f"\nexif\n{len(exif)}\n" + exif.hex(), zip=True)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20)).save(buffer, "PNG", pnginfo=text)
    assert decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**6).width == 40 and not parsed
    at_zero = b"II*\x00" + struct.pack("<I", 0) + bytes(8)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20)).save(buffer, "PNG", exif=at_zero)
    assert decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**6).width == 40 and not parsed


def test_an_orientation_of_many_values_is_not_parsed(parsed: list[int]) -> None:
    # A third reviewer's: one orientation entry of 1.9 million rationals, each an object once read (2 s, +293 MiB).
    values = 100_000
    exif = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<HHHII", 1, 0x0112, 5, values, 26) + bytes(4)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20)).save(buffer, "PNG", exif=exif + bytes(8 * values))
    assert decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**6).width == 40 and not parsed
