"""Every file in tests/images and every generated kind, posted to the in-process app.

Each case asserts the exact status; a decodable file must report its displayed size and come
back with a prediction, an undecodable one with a problem that names what is wrong.
"""

from __future__ import annotations

import csv
import io

import pytest
from PIL import Image

from service.core.errors import InvalidImage
from service.imaging.formats import HEIF_AVAILABLE
from service.imaging.images import decode_image
from tests.conftest import ROOT, running_app
from tests.service.image_fixtures import GENERATED

pytestmark = pytest.mark.anyio
IMAGES = ROOT / "tests" / "images"
CLASSIFY = "/v1/models/vit-digits/classify"
LABELS = {str(i) for i in range(10)}

# Status and displayed (width, height), or status and a part of the problem's detail.
COMMITTED: dict[str, tuple[int, tuple[int, int] | str]] = {
    "exif_orientation/Landscape_1.jpg": (200, (1800, 1200)),
    "exif_orientation/Landscape_3.jpg": (200, (1800, 1200)),
    "exif_orientation/Landscape_6.jpg": (200, (1800, 1200)),
    "exif_orientation/Landscape_8.jpg": (200, (1800, 1200)),
    "exif_orientation/Portrait_1.jpg": (200, (1200, 1800)),
    "exif_orientation/Portrait_5.jpg": (200, (1200, 1800)),
    "pillow/app13-multiple.jpg": (200, (256, 160)),
    "pillow/broken.png": (415, "the PNG image is corrupt"),
    "pillow/chi.gif": (200, (320, 240)),
    "pillow/decompression_bomb.gif": (413, "4364696535 pixels"),
    # A reviewer's (2026-12-05): two ispe properties on one item, 16x16 first (which libavif reads)
    # then 2048x2048, around a 2048x2048 AV1 frame; the pre-scan took the last and let it through.
    "generated/avif_two_ispe.avif": (413, "AV1 frame is 2048x2048, larger than the 16x16 its item declares"),
    # The same reviewer's: an image sequence whose track says 16x16 around 12000x12000 frames (+283 MiB).
    "generated/avif_sequence_track.avif": (413, "AV1 frame is 12000x12000, larger than the 16x16 its track declares"),
    # A fifth reviewer's (2026-12-05), each +283 to +286 MiB behind 256 reserved pixels before the fix:
    "generated/avif_frame_size_override.avif": (413, "codes frames up to 65536x65536"),
    "generated/avif_alpha_item_larger.avif": (413, "a 12000x12000 item inside its 16x16 image"),
    "generated/avif_alpha_track_larger.avif": (413, "larger than the 16x16 track beside it declares"),
    "generated/avif_sequence_two_mdia.avif": (415, "2 mdia boxes where libavif reads one"),
    "generated/avif_sequence_co64_and_stco.avif": (415, "not exactly one chunk-offset table"),
    "generated/avif_sequence_two_stsz.avif": (415, "2 stsz boxes where libavif reads one"),
    "generated/avif_sequence_cut_decoy_track.avif": (415, "a table shorter than its fields"),
    "generated/avif_sequence_ten_tracks.avif": (413, "more than 8 AV1 tracks"),
    # A sixth reviewer's: a grid decoded to its own output size, not its ispe (+124 MiB here, +1.9 GiB at
    # 16384x16384 behind 1 MP); tiles given a dav1d each by differing a1op (+173 MiB, +1.1 GiB on 16
    # cores); an empty tkhd at the end of the file (an IndexError, a 500). The same grid without a1op decodes.
    "generated/avif_grid_output_larger.avif": (413, "grid is 4096x4096, larger than the 256x256 it declares"),
    "generated/avif_grid_operating_points.avif": (413, "select different AV1 operating points or layers"),
    "generated/avif_grid_256_tiles.avif": (200, (1024, 1024)),
    "generated/avif_sequence_empty_tkhd.avif": (415, "a table shorter than its fields"),
    # A seventh reviewer's: two a1op on each tile, 1 then 0; the walk kept the last, libavif reads the first (+171 MiB).
    "generated/avif_grid_two_a1op.avif": (413, "select different AV1 operating points or layers"),
    "pillow/hopper.bmp": (200, (128, 128)),
    "pillow/hopper.heif": (200, (128, 128)),  # with the heic extra, which `make test` installs
    "pillow/hopper.tif": (200, (128, 128)),
    "pillow/hopper.webp": (200, (128, 128)),
    "pillow/hopper_gray.jpg": (200, (128, 128)),
    "pillow/i_trns.png": (200, (64, 64)),
    "pillow/pil123p.png": (200, (162, 150)),
    "pillow/pil123rgba.png": (200, (162, 150)),
    "pillow/pil_sample_cmyk.jpg": (200, (100, 100)),
    "pillow/truncated_jpeg.jpg": (415, "the JPEG image is truncated"),
    "skimage/astronaut.png": (200, (512, 512)),
    "skimage/chelsea.png": (200, (451, 300)),
    "skimage/coffee.png": (200, (600, 400)),
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client():
    async with running_app(max_batch_size=4) as client:
        yield client


def test_every_committed_image_has_an_expectation_and_a_licence() -> None:
    on_disk = {str(p.relative_to(IMAGES)) for p in IMAGES.rglob("*") if p.is_file() and p.suffix not in (".tsv", ".md")}
    with (IMAGES / "MANIFEST.tsv").open(newline="") as manifest:
        rows = {row["local_path"]: row for row in csv.DictReader(manifest, delimiter="\t")}
    assert on_disk == set(COMMITTED) == set(rows)
    assert all(rows[path]["license"] and rows[path]["source_repo"] for path in rows)


def test_the_heic_extra_is_installed_where_the_suite_runs() -> None:
    # `make test` installs .[cpu,train,dev,heic]; the path without it is tested in test_images.py.
    assert HEIF_AVAILABLE, "pillow-heif missing: `make test` installs the heic extra into .venv"


async def _check(client, data: bytes, status: int, expected: tuple[int, int] | str | None) -> None:
    response = await client.post(CLASSIFY, files={"image": ("upload", data)}, params={"top_k": 1})
    assert response.status_code == status, response.text
    body = response.json()
    if status == 200:
        assert body["image"] == {"width": expected[0], "height": expected[1]}
        (prediction,) = body["predictions"]
        assert prediction["label"] in LABELS and 0.0 <= prediction["score"] <= 1.0
    else:
        assert response.headers["content-type"] == "application/problem+json"
        assert body["status"] == status and expected in body["detail"], body


@pytest.mark.parametrize("path", sorted(COMMITTED))
async def test_committed_image(client, path: str) -> None:
    status, expected = COMMITTED[path]
    await _check(client, (IMAGES / path).read_bytes(), status, expected)


@pytest.mark.parametrize("name", sorted(GENERATED))
async def test_generated_image(client, name: str) -> None:
    case = GENERATED[name]()
    await _check(client, case.data, case.status, case.size if case.status == 200 else case.detail)


async def test_every_kind_in_one_request_answers_each_in_order(client) -> None:
    names = ["exif-orientation-6.jpg", "bomb-header.png", "truncated.gif", "cmyk.jpg", "document.pdf"]
    cases = [GENERATED[n]() for n in names]
    files = [("image", (n, c.data)) for n, c in zip(names, cases, strict=True)] + [("image", ("empty", b""))]
    response = await client.post(CLASSIFY, files=files, params={"top_k": 1})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r.get("status", 200) for r in results] == [200, 413, 415, 200, 415, 400]
    assert results[0]["image"] == {"width": 48, "height": 32} and results[3]["image"] == {"width": 16, "height": 12}
    assert "PDF" in results[4]["detail"] and "empty" in results[5]["detail"]


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\x00" * 64, "JPEG 2000"),
        (b"\xff\x0a" + b"\x00" * 64, "JPEG XL"),
    ],
    ids=["jpeg2000", "jpegxl"],
)
def test_jpeg_2000_and_jpeg_xl_are_not_accepted_rather_than_corrupt_jpegs(data: bytes, name: str) -> None:
    with pytest.raises(InvalidImage, match=f"{name} files are not accepted"):
        decode_image(data, color_mode="RGB", max_pixels=10**6)


def _tga(footer: bool) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (10, 20, 30)).save(out, "TGA")  # uncompressed: starts 00 00 02 00, as a CUR
    data = out.getvalue()
    return data if footer else data[: -len(b"\x00" * 8 + b"TRUEVISION-XFILE.\x00")]


def test_an_uncompressed_tga_is_not_named_a_cur() -> None:
    # Found by a fresh user: a TGA written by Pillow was refused as "CUR files are not accepted".
    for footer, detail in ((True, "TGA files are not accepted; send one of JPEG"), (False, "not an image in a format")):
        data = _tga(footer)
        assert data[:4] == b"\x00\x00\x02\x00"
        with pytest.raises(InvalidImage, match=detail) as refused:
            decode_image(data, color_mode="RGB", max_pixels=10**6)
        assert "CUR" not in str(refused.value) and refused.value.status == 415
    mapped = _tga(True)
    mapped = mapped[:4] + b"\x01\x00" + mapped[6:]  # colour-map bytes that look like a CUR's image count
    with pytest.raises(InvalidImage, match="TGA files are not accepted"):  # the footer decides (found in review)
        decode_image(mapped, color_mode="RGB", max_pixels=10**6)
    cursor = io.BytesIO()
    Image.new("RGB", (16, 16)).save(cursor, "ICO")
    cur = b"\x00\x00\x02\x00" + cursor.getvalue()[4:]  # an ICO's directory with a cursor's type: a CUR
    with pytest.raises(InvalidImage, match="CUR files are not accepted"):
        decode_image(cur, color_mode="RGB", max_pixels=10**6)


def test_a_jpeg_cut_after_its_start_marker_is_truncated_not_unknown() -> None:
    with pytest.raises(InvalidImage, match="the JPEG image is truncated"):
        decode_image(b"\xff\xd8", color_mode="RGB", max_pixels=10**6)


def test_a_png_cut_in_its_header_is_truncated_not_corrupt() -> None:
    whole = io.BytesIO()
    Image.new("RGB", (40, 30)).save(whole, "PNG")
    with pytest.raises(InvalidImage, match="the PNG image is truncated"):  # Pillow: "Truncated File Read"
        decode_image(whole.getvalue()[:20], color_mode="RGB", max_pixels=10**6)
