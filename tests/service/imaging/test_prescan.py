"""The JPEG and PNG pre-scan: bombs refused before Pillow opens them, real files untouched (issue 15 B, C).

Each bomb is the issue's reproduction. "Before Pillow opens it" is shown by counting calls to
``PIL.Image.open`` (never by a timer): the bombs make none, the ordinary images sent beside
them one each.
"""

from __future__ import annotations

import asyncio
import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.core.errors import PayloadTooLarge
from service.imaging.images import decode_image
from service.imaging.prescan import PrescanLimits, prescan
from tests.conftest import ROOT, running_app

LIMITS = PrescanLimits()


def _jpeg(size: tuple[int, int] = (64, 64), **options: object) -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png(size: tuple[int, int] = (64, 64), icc_profile: bytes | None = None) -> bytes:
    buffer = io.BytesIO()
    options = {"icc_profile": icc_profile} if icc_profile else {}
    Image.new("RGB", size, (10, 200, 30)).save(buffer, "PNG", **options)
    return buffer.getvalue()


def app0_bomb() -> bytes:
    """5.2 million empty APP0 segments (20.8 MB): 8.2 s and +707 MiB in Pillow's header parser."""
    j = _jpeg()
    return j[:2] + b"\xff\xe0\x00\x02" * 5_200_000 + j[2:]


def fill_bomb() -> bytes:
    """20 million 0xFF fill bytes before the first marker (T.81 B.1.1.2): 11.5 s in Pillow."""
    j = _jpeg()
    return j[:2] + b"\xff" * 20_000_000 + j[2:]


def png_chunk_bomb() -> bytes:
    """1.7 million empty private chunks after IHDR: 5.5 s, +225 MiB in Pillow."""
    p = _png()
    ihdr_end = 8 + 25
    return p[:ihdr_end] + _png_chunk(b"prIv", b"") * 1_700_000 + p[ihdr_end:]


def _gif() -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (8, 8), 90).save(buffer, "GIF")
    return buffer.getvalue()


def gif_comment_bomb() -> bytes:
    """5 million one-byte comment sub-blocks before the image (10 MB): 3.2 s in Pillow's GIF parser."""
    g = _gif()
    start = 13 + 3 * (2 << (g[10] & 7)) if g[10] & 0x80 else 13  # after the global colour table
    return g[:start] + b"\x21\xfe" + b"\x01a" * 5_000_000 + b"\x00" + g[start:]


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each segment of a JPEG from Pillow, SOS segments with their scan data."""
    pos, out = 2, []
    while pos < len(data):
        assert data[pos] == 0xFF
        marker = data[pos + 1]
        if marker == 0xD9:
            out.append((marker, pos, pos + 2))
            break
        (length,) = struct.unpack_from(">H", data, pos + 2)
        end = pos + 2 + length
        if marker == 0xDA:  # the scan's entropy-coded data runs to the next marker that is not RST or stuffing
            while not (data[end] == 0xFF and data[end + 1] not in (0x00, *range(0xD0, 0xD8))):
                end += 1
        out.append((marker, pos, end))
        pos = end
    return out


def scan_bomb(side: int = 6000, repeats: int = 500) -> bytes:
    """A flat ``side`` x ``side`` progressive JPEG whose last refinement scan is repeated ``repeats`` times.

    Issue 15 B: 6000x6000 and 500 repeats is 170 KB and costs about 10 s of libjpeg's CPU.
    """
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (128, 64, 200)).save(buffer, "JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    segments = _segments(data)
    _, start, end = [s for s in segments if s[0] == 0xDA][-1]
    eoi = segments[-1][1]
    return data[:eoi] + data[start:end] * repeats + data[eoi:]


def count_scans(data: bytes) -> int:
    return sum(marker == 0xDA for marker, _, _ in _segments(data))


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {
        "app0": app0_bomb(),
        "fill": fill_bomb(),
        "png-chunks": png_chunk_bomb(),
        "gif-blocks": gif_comment_bomb(),
        "scans": scan_bomb(side=64),  # 510 scans of a 64x64 image: over the scan cap
        "scan-pixels": scan_bomb(),  # the issue's: 510 scans of 36 MP, over the work budget at 28
        "scan-pixels-under-cap": scan_bomb(repeats=40),  # 50 scans of 36 MP: under the cap, over the budget
    }


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("app0", "more than 1024 marker segments"),
        ("fill", "more than 65536 fill or junk bytes"),
        ("png-chunks", "more than 10000 chunks"),
        ("gif-blocks", "more than 20000 extension blocks"),
        ("scans", "more than 64 scans"),
        ("scan-pixels", "scan pixels"),
        ("scan-pixels-under-cap", "at least 28 scans of 36000000 pixels"),
    ],
)
def test_each_bomb_is_a_413_from_the_prescan_in_milliseconds(bombs, name: str, part: str) -> None:
    data = bombs[name]
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge, match=part):
        prescan(data, LIMITS)
    elapsed = time.perf_counter() - started
    print(f"{name}: {len(data)} bytes refused in {elapsed * 1e3:.2f} ms")  # reported, never asserted


def test_the_scan_bomb_is_what_the_issue_describes(bombs, monkeypatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # decode_image lowers it to half its own limit
    assert count_scans(bombs["scan-pixels"]) == 510  # libjpeg's 10-scan colour progressive script + 500
    assert len(bombs["scan-pixels"]) < 300_000  # a few hundred KB (the issue's encoder: 170 KB)
    with Image.open(io.BytesIO(bombs["scan-pixels"])) as image:  # a valid file: only its cost is hostile
        assert image.size == (6000, 6000) and image.info.get("progressive") == 1


def _real_files() -> list[Path]:
    folders = [ROOT / "tests" / "images", ROOT / "examples", Path("/work/shared/images")]
    suffixes = (".jpg", ".png", ".gif")
    return sorted(p for f in folders if f.exists() for p in f.rglob("*") if p.suffix.lower() in suffixes)


def test_real_files_and_encoder_options_pass_the_prescan() -> None:
    files = [p.read_bytes() for p in _real_files()]
    assert len(files) >= 10
    exif = Image.Exif()
    exif[0x0112] = 6
    generated = [
        _jpeg((640, 480), progressive=True, quality=95),
        _jpeg((640, 480), progressive=True, optimize=True, subsampling=0),
        _jpeg((6000, 40), progressive=True, restart_marker_blocks=1),
        _jpeg((300, 200), exif=exif.tobytes(), icc_profile=b"\0" * 3_000_000, comment=b"x" * 60_000),
        _png((800, 600), icc_profile=b"\1" * 2_000_000),
        _gif(),
    ]
    animated = io.BytesIO()
    frames = [Image.new("P", (32, 32), i) for i in range(30)]
    frames[0].save(animated, "GIF", save_all=True, append_images=frames[1:], comment=b"c" * 5000, loop=0)
    generated.append(animated.getvalue())
    for data in files + generated:
        prescan(data, LIMITS)


def test_a_2_mb_icc_profile_is_read_up_to_the_metadata_limit() -> None:
    # Issue 15, smaller: Pillow's 1 MiB MAX_TEXT_CHUNK made this valid PNG "corrupt".
    profile = bytes(range(256)) * 8192  # 2 MiB, incompressible enough
    data = _png((32, 32), icc_profile=profile)
    decoded = decode_image(data, color_mode="RGB", max_pixels=10**6)
    assert decoded.image.getpixel((0, 0)) == (10, 200, 30)
    with pytest.raises(PayloadTooLarge, match=r"metadata.*PATCHSERVE_MAX_IMAGE_METADATA_BYTES"):
        decode_image(data, color_mode="RGB", max_pixels=10**6, limits=PrescanLimits(max_metadata_bytes=1_000_000))
    small = PrescanLimits(max_metadata_bytes=100_000)
    with pytest.raises(PayloadTooLarge, match="metadata"):  # compressed size over the limit: the pre-scan
        prescan(_png((8, 8), icc_profile=np.random.default_rng(1).bytes(200_000)), small)
    jpeg = _jpeg((16, 16), icc_profile=profile)
    assert decode_image(jpeg, color_mode="RGB", max_pixels=10**6).image.size == (16, 16)
    with pytest.raises(PayloadTooLarge, match="JPEG image's metadata"):
        decode_image(jpeg, color_mode="RGB", max_pixels=10**6, limits=small)


@pytest.mark.anyio
async def test_bombs_sent_with_ordinary_requests_never_reach_pillow(bombs, monkeypatch) -> None:
    # Issue 15 acceptance: every bomb class concurrently with ordinary requests; the bombs are
    # refused by the pre-scan before Pillow opens them, and every ordinary request gets 200.
    opened: list[int] = []
    real_open = Image.open

    def counting_open(fp, *args, **kwargs):
        opened.append(len(fp.getvalue()) if isinstance(fp, io.BytesIO) else -1)
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    ordinary = (ROOT / "examples" / "digit-7.png").read_bytes()
    ordinary_jpeg = _jpeg((64, 64), progressive=True)
    headers = {"content-type": "application/octet-stream"}
    async with running_app() as client:
        url = "/v1/models/vit-digits/classify"
        sends = [client.post(url, content=data, headers=headers) for data in bombs.values()]
        sends += [client.post(url, content=data, headers=headers) for data in [ordinary, ordinary_jpeg] * 4]
        responses = await asyncio.gather(*sends)
    statuses = [r.status_code for r in responses]
    assert statuses == [413] * len(bombs) + [200] * 8, [r.text[:200] for r in responses]
    assert all(r.json()["predictions"][0]["label"] == "7" for r in responses[len(bombs) :: 2])
    # Each ordinary file is opened once (its header read for the pixel budget, then decoded from
    # there: issue 14, no second pre-scan and parse); not one bomb.
    assert sorted(opened) == sorted([len(ordinary), len(ordinary_jpeg)] * 4)


def test_a_single_scan_over_the_scan_budget_is_left_to_the_image_pixel_limit() -> None:
    # A 65535x65535 baseline JPEG header: its 413 says the image is over the 40 MP limit, not that
    # it has "at least 1 scans" of too many pixels (a fresh user found the scan words confusing).
    data = bytearray(_jpeg((16, 16)))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (65535).to_bytes(2, "big") * 2
    prescan(bytes(data), LIMITS)  # passes: one scan
    with pytest.raises(PayloadTooLarge, match="declares 4294836225 pixels; the limit is 40000000"):
        decode_image(bytes(data), color_mode="RGB", max_pixels=40_000_000)
