"""The JPEG, PNG, GIF and TIFF pre-scan: bombs refused before Pillow opens them, real files untouched (issue 15 B, C).

Each bomb is the issue's reproduction. "Before Pillow opens it" is shown by counting calls to
``PIL.Image.open`` (never by a timer): the bombs make none, the ordinary images sent beside
them one each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, TiffImagePlugin

from service.core.errors import InvalidImage, PayloadTooLarge
from service.core.settings import Settings
from service.http.app import decode_limits
from service.imaging.images import decode_image, open_image
from service.imaging.prescan import prescan
from service.imaging.prescan_avif import coded_items, sequence_tracks
from service.imaging.prescan_limits import PrescanLimits
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


def _bmp_rle8(width: int, height: int, rle: bytes) -> bytes:
    """An 8-bit grey-palette BMP (BITMAPINFOHEADER, BI_RLE8) whose pixel data is ``rle``."""
    palette = b"".join(bytes((i, i, i, 0)) for i in range(256))
    start = 14 + 40 + len(palette)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 8, 1, len(rle), 2835, 2835, 256, 0)
    return b"BM" + struct.pack("<IHHI", start + len(rle), 0, 0, start) + info + palette + rle


def bmp_rle_strip_bomb() -> bytes:
    """A fresh user's 1 KB 40,000,000x1 RLE8 bitmap: a delta fills the row, an end-of-line pads it byte by
    byte in Pillow's Python decoder (3.7 s, +350 MiB)."""
    return _bmp_rle8(40_000_000, 1, b"\x01\x07" + b"\x00\x00" + b"\x00\x01")


def _ico(images: list[bytes], sides: list[int]) -> bytes:
    """An ICO whose directory gives each of ``images`` (PNG or BMP data) the side in ``sides`` (0 meaning 256)."""
    offset, directory = 6 + 16 * len(images), b""
    for image, side in zip(images, sides, strict=True):
        directory += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(image), offset)
        offset += len(image)
    return struct.pack("<HHH", 0, 1, len(images)) + directory + b"".join(images)


def ico_png_bomb(side: int = 6324) -> bytes:
    """A fresh user's ICO: a directory saying 256x256 around a flat ``side`` x ``side`` PNG, which Pillow
    decodes inside Image.open (32 in one request: 23.6 s, +5.3 GiB)."""
    png = io.BytesIO()
    Image.new("L", (side, side), 200).save(png, "PNG")
    return _ico([png.getvalue()], [0])


def _tiff(entries: list[tuple[int, int, int, int]], blob: bytes = b"", *, big: bool = False, order: str = "<") -> bytes:
    """A TIFF (TIFF 6.0, Section 2; BigTIFF with ``big``): header, ``blob`` at offset 16, then one IFD.

    ``entries`` are (tag, type, count, value); a value of -k means offset 16 + k into ``blob``.
    """
    head = 16
    ifd = head + len(blob)
    fixed = [(tag, kind, count, head - value if value < 0 else value) for tag, kind, count, value in entries]
    if order == ">":  # a big-endian SHORT or BYTE held in its entry sits in the field's first bytes
        width = 8 if big else 4
        small = {1: 1, 3: 2, 6: 1, 7: 1, 8: 2}
        fixed = [(t, k, c, v << 8 * (width - small[k]) if c == 1 and k in small else v) for t, k, c, v in fixed]
    if big:
        header = (b"II" if order == "<" else b"MM") + struct.pack(order + "HHHQ", 43, 8, 0, ifd)
        table = struct.pack(order + "Q", len(fixed)) + b"".join(struct.pack(order + "HHQQ", *e) for e in fixed)
        table += bytes(8)
    else:
        header = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, ifd) + bytes(8)
        table = struct.pack(order + "H", len(fixed)) + b"".join(struct.pack(order + "HHII", *e) for e in fixed)
        table += bytes(4)
    return header + blob + table


def _grey_tiff_entries(width: int, height: int, rows_per_strip: int, strips: int, offsets: int, counts: int) -> list:
    long_ = 4
    return [
        (256, long_, 1, width),
        (257, long_, 1, height),
        (258, 3, 1, 8),
        (259, 3, 1, 1),  # no compression
        (262, 3, 1, 1),  # black is zero
        (273, long_, strips, offsets),
        (277, 3, 1, 1),
        (278, long_, 1, rows_per_strip),
        (279, long_, strips, counts),
    ]


def tiff_strip_bomb(height: int = 1_800_000, order: str = "<") -> bytes:
    """An uncompressed 1 x ``height`` grey TIFF, one row (one byte) per strip: with 1.8 million
    strips (16 MB), 6.9 s and +630 MiB in Pillow (a fresh-user session's find)."""
    pixels = (np.arange(height) % 256).astype(np.uint8).tobytes()
    offsets = struct.pack(f"{order}{height}I", *range(16, 16 + height))
    counts = struct.pack(f"{order}{height}I", *([1] * height))
    entries = _grey_tiff_entries(1, height, 1, height, -len(pixels), -(len(pixels) + len(offsets)))
    return _tiff(entries, pixels + offsets + counts, order=order)


def _tiff_8x8(extra: list[tuple[int, int, int, int]] = [], blob: bytes = b"", **options) -> bytes:  # noqa: B006
    entries = _grey_tiff_entries(8, 8, 8, 1, 16, 64)
    return _tiff(sorted(entries + extra), bytes(range(64)) + blob, **options)


# Tags that Pillow gives a meaning, left out of the bombs' private tags.
_KNOWN = {513, 514, 530, 532, 700, 33432, 33723, 34377, 34665, 34675, 34853, 37724, 48129, 50741}  # 48129: JPEG XR
_PRIVATE = [t for t in range(400, 65535) if t not in _KNOWN]


def tiff_tag_bomb() -> bytes:
    """65,000 IFD entries (the most a classic IFD holds is 65,535)."""
    return _tiff_8x8([(t, 3, 1, 1) for t in _PRIVATE[:65_000]])


def tiff_claims_bomb() -> bytes:
    """60,000 entries each claiming 2^30 values: one logged warning from Pillow per entry."""
    return _tiff_8x8([(t, 4, 2**30, 16) for t in _PRIVATE[:60_000]])


def tiff_exif_bomb() -> bytes:
    """An 8x8 TIFF whose EXIF IFD, which Pillow reads for the orientation, holds 65,000 entries."""
    sub = struct.pack("<H", 65_000) + b"".join(struct.pack("<HHII", t, 3, 1, 1) for t in _PRIVATE[:65_000])
    return _tiff_8x8([(34665, 4, 1, 16 + 64)], sub + bytes(4))


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
        "tiff-strips": tiff_strip_bomb(),
        "tiff-tags": tiff_tag_bomb(),
        "tiff-claims": tiff_claims_bomb(),
        "tiff-exif-tags": tiff_exif_bomb(),
        "bigtiff-strips": _tiff(_grey_tiff_entries(1, 20_000, 1, 20_000, 16, 16), bytes(20_000), big=True),
        "tiff-metadata": _tiff_8x8([(50_000, 7, 17_000_000, 16 + 64)], bytes(17_000_000), order="<"),
        "bmp-rle-strip": bmp_rle_strip_bomb(),
        "ico-png": ico_png_bomb(),
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
        ("tiff-strips", "1800000 strips or tiles, more than 16384"),
        ("tiff-tags", "IFD of 65009 entries, more than 1024"),
        ("tiff-claims", "IFD of 60009 entries"),
        ("tiff-exif-tags", "IFD of 65000 entries"),
        ("bigtiff-strips", "20000 strips or tiles"),
        ("tiff-metadata", "TIFF image's metadata is at least 17000000 bytes"),
        ("bmp-rle-strip", "run-length encoded with 40000000 pixels, more than 1048576"),
        ("ico-png", "embeds a 6324x6324 image; an icon's images are at most 256x256"),
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


def test_the_tiff_bombs_are_valid_files_whose_cost_alone_is_hostile(monkeypatch) -> None:
    # The strip bomb's structure, smaller: Pillow's raw decoder makes one tile per strip; the
    # server has libtiff read it (decode_image sets READ_LIBTIFF), and the pre-scan lets it
    # through under a limit raised above its strips.
    data = tiff_strip_bomb(height=20_000)
    with pytest.raises(PayloadTooLarge, match="20000 strips"):
        prescan(data, LIMITS)
    prescan(data, PrescanLimits(max_tiff_strips=20_000))
    monkeypatch.setattr(TiffImagePlugin, "READ_LIBTIFF", False)
    with Image.open(io.BytesIO(data)) as image:
        assert len(image.tile) == 20_000
        assert np.array_equal(np.asarray(image).ravel(), np.arange(20_000) % 256)
    decoded = decode_image(data, color_mode="L", max_pixels=10**6, limits=PrescanLimits(max_tiff_strips=20_000))
    assert TiffImagePlugin.READ_LIBTIFF is True
    assert np.array_equal(np.asarray(decoded.image).ravel(), np.arange(20_000) % 256)
    with Image.open(io.BytesIO(tiff_tag_bomb())) as image:
        assert len(image.tag_v2) >= 65_000 - len(_KNOWN)  # each parsed: the cost the cap bounds
    with Image.open(io.BytesIO(tiff_exif_bomb())) as image:
        assert len(image.getexif().get_ifd(0x8769)) == 65_000


def test_tiffs_at_the_limits_pass_in_both_byte_orders() -> None:
    limits = PrescanLimits(max_tiff_strips=64, max_tiff_tags=32, max_metadata_bytes=4096)
    for order in "<>":
        strips = _tiff(_grey_tiff_entries(1, 64, 1, 64, 16, 16), bytes(64), order=order)
        prescan(strips, limits)
        private = [(t, 3, 1, 1) for t in _PRIVATE[: 32 - 9]]
        prescan(_tiff_8x8(private, order=order), limits)
        with pytest.raises(PayloadTooLarge, match="33 entries"):
            prescan(_tiff_8x8([*private, (_PRIVATE[23], 3, 1, 1)], order=order), limits)
        prescan(_tiff_8x8([(50_000, 7, 4096, 16 + 64)], bytes(4096), order=order), limits)
        with pytest.raises(PayloadTooLarge, match="metadata is at least 4097"):
            prescan(_tiff_8x8([(50_000, 7, 4097, 16 + 64)], bytes(4097), order=order), limits)
    # A claim past the end of the file counts what the file holds (Pillow skips the rest).
    prescan(_tiff_8x8([(50_000, 4, 2**30, 16)]), limits)
    # Truncated and corrupt files are Pillow's to name: the walk stops without reading past the end.
    whole = _tiff_8x8([(t, 3, 1, 1) for t in _PRIVATE[:5]])
    for cut in range(len(whole)):
        prescan(whole[:cut], limits)


def _real_files() -> list[Path]:
    folders = [ROOT / "tests" / "images", ROOT / "examples", Path("/work/shared/images")]
    suffixes = (".jpg", ".png", ".gif", ".tif", ".tiff", ".bmp", ".ico")
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
    for compression in ("raw", "tiff_lzw", "tiff_adobe_deflate", "jpeg", "packbits"):
        tiff = io.BytesIO()
        photo = Image.fromarray(np.random.default_rng(2).integers(0, 256, (3000, 2000, 3), dtype=np.uint8))
        photo.save(tiff, "TIFF", compression=compression, exif=exif, icc_profile=b"\0" * 100_000, dpi=(300, 300))
        generated.append(tiff.getvalue())
    for fmt, options in (("BMP", {}), ("ICO", {"sizes": [(16, 16), (48, 48), (256, 256)]})):
        saved = io.BytesIO()
        Image.fromarray(np.random.default_rng(3).integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(
            saved, fmt, **options
        )
        generated.append(saved.getvalue())
    pages = io.BytesIO()
    frames[0].convert("L").save(pages, "TIFF", save_all=True, append_images=[f.convert("L") for f in frames[1:]])
    generated.append(pages.getvalue())
    assert sum(data.startswith((b"II*", b"MM\x00*")) for data in files + generated) >= 7
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


def test_every_prescan_limit_is_a_setting() -> None:
    # Each PATCHSERVE_MAX_* pre-scan setting reaches the pre-scan (the TIFF two were added after the others).
    names = {field.name: field.name for field in dataclasses.fields(PrescanLimits)}
    names["max_metadata_bytes"] = "max_image_metadata_bytes"
    values = {setting: 100_000 + i for i, setting in enumerate(names.values())}
    limits = decode_limits(Settings(**values)).prescan
    assert dataclasses.asdict(limits) == {field: values[setting] for field, setting in names.items()}


# A reviewer's ways past the first TIFF pre-scan (2026-12-05), each 4-20 s or +0.4-1.4 GiB at 20 MiB.
def _sub_ifd(entries: int) -> bytes:
    """An IFD of ``entries`` private SHORT entries (little-endian), to be placed anywhere."""
    return (
        struct.pack("<H", entries) + b"".join(struct.pack("<HHII", t, 3, 1, 1) for t in _PRIVATE[:entries]) + bytes(4)
    )


def _with_exif_pointer(kind: int, count: int, value_field: int, blob: bytes) -> bytes:
    return _tiff_8x8([(34665, kind, count, value_field)], blob)


BLOB = 16 + 64  # where _tiff_8x8's blob starts


@pytest.mark.parametrize(
    ("name", "build"),
    [
        # Pillow takes a SHORT pointer's first two bytes and ignores the junk beside them.
        ("short pointer with junk", lambda: _with_exif_pointer(3, 1, BLOB | (0xBEEF << 16), _sub_ifd(65_000))),
        # A count-2 LONG: out of line, Pillow takes the first value.
        (
            "count-2 long pointer",
            lambda: _with_exif_pointer(4, 2, BLOB, struct.pack("<II", BLOB + 8, 0) + _sub_ifd(65_000)),
        ),
        # A LONG8 in a classic TIFF: 8 bytes, out of line.
        ("long8 pointer", lambda: _with_exif_pointer(16, 1, BLOB, struct.pack("<Q", BLOB + 8) + _sub_ifd(65_000))),
    ],
)
def test_an_exif_pointer_is_read_as_pillow_reads_it(name: str, build) -> None:
    data = build()
    with Image.open(io.BytesIO(data)) as image:  # Pillow finds the hidden IFD
        assert len(image.getexif().get_ifd(0x8769)) == 65_000, name
    with pytest.raises(PayloadTooLarge, match="IFD of 65000 entries"):
        prescan(data, LIMITS)


def test_tiff_headers_are_read_as_pillow_reads_them() -> None:
    little = bytearray(tiff_strip_bomb(height=20_000))
    little[2:4] = b"\x00\x2a"  # II\0*: one of Pillow's PREFIXES
    swapped = bytearray(tiff_strip_bomb(height=20_000, order=">"))
    swapped[2:4] = b"\x2a\x00"  # MM*\0: another
    for data in (bytes(little), bytes(swapped)):
        with Image.open(io.BytesIO(data)) as image:
            assert image.size == (1, 20_000)
        with pytest.raises(PayloadTooLarge, match="20000 strips"):
            prescan(data, LIMITS)
    # MM\0+: Pillow tests byte 2 for 43, so it reads a big-endian BigTIFF as a classic TIFF
    # (a bomb laid out as one opens); refused whole, as Pillow cannot read a real one.
    big_endian = bytearray(tiff_strip_bomb(height=20_000, order=">"))
    big_endian[3] = 0x2B
    with Image.open(io.BytesIO(bytes(big_endian))) as image:
        assert image.size == (1, 20_000)
    with pytest.raises(InvalidImage, match="big-endian BigTIFF"):
        prescan(bytes(big_endian), LIMITS)


def test_an_ifd_pointed_to_twice_is_refused() -> None:
    sub = _sub_ifd(3)
    shared = _tiff_8x8([(34665, 4, 1, BLOB), (34853, 4, 1, BLOB)], sub)
    with pytest.raises(PayloadTooLarge, match="GPS IFD is one it has already pointed to"):
        prescan(shared, LIMITS)
    looped = _tiff_8x8([(34665, 4, 1, BLOB)])  # no blob: the first IFD itself is at BLOB
    assert struct.unpack_from("<I", looped, 4)[0] == BLOB  # the EXIF pointer names the first IFD
    with pytest.raises(PayloadTooLarge, match="EXIF IFD is one it has already pointed to"):
        prescan(looped, LIMITS)
    prescan(_tiff_8x8([(34665, 4, 1, BLOB)], sub), LIMITS)  # pointed to once: fine


def test_numbers_pillow_makes_objects_of_are_counted() -> None:
    rationals = _tiff_8x8([(282, 5, 70_000, BLOB)], bytes(8 * 70_000))  # XResolution: a Fraction each
    with pytest.raises(PayloadTooLarge, match="more than 1048576 numbers"):
        prescan(rationals, LIMITS)
    prescan(_tiff_8x8([(282, 5, 60_000, BLOB)], bytes(8 * 60_000)), LIMITS)  # 960,000: under
    colour_map = _tiff_8x8([(320, 3, 3 * 65_536, BLOB)], bytes(2 * 3 * 65_536))  # a 16-bit palette's
    prescan(colour_map, LIMITS)
    xmp = _tiff_8x8([(700, 7, 1_000_000, BLOB)], bytes(1_000_000))  # bytes stay bytes
    prescan(xmp, LIMITS)


def test_the_interoperability_ifd_is_walked_from_the_exif_ifd() -> None:
    interop_at = BLOB + 18  # after a one-entry EXIF IFD (2 + 12 + 4 bytes)
    exif = struct.pack("<H", 1) + struct.pack("<HHII", 40965, 4, 1, interop_at) + bytes(4)
    data = _tiff_8x8([(34665, 4, 1, BLOB)], exif + _sub_ifd(65_000))
    with pytest.raises(PayloadTooLarge, match="IFD of 65000 entries"):
        prescan(data, LIMITS)


def _progressive_strip(size: tuple[int, int], repeats: int = 0) -> bytes:
    """A progressive JPEG of random pixels (libjpeg's 10-scan script) with its last scan repeated ``repeats`` times."""
    jpeg = _jpeg(size, progressive=True, quality=90)
    scans = [start for marker, start, _ in _segments(jpeg) if marker == 0xDA]
    end = jpeg.rindex(b"\xff\xd9")
    return jpeg[:end] + jpeg[scans[-1] : end] * repeats + jpeg[end:]


def _jpeg_tiff(
    strips: list[bytes], width: int, rows: int, at: list[int] | None = None, counts: list[int] | None = None
):
    """A YCbCr 4:2:0 TIFF whose strips are the JPEG streams ``strips``, ``rows`` rows of ``width`` each (TIFF
    Technical Note 2, as libtiff writes it, no JPEGTables); ``at`` and ``counts``: the strips' offsets into the
    streams' bytes and their byte counts, instead of one stream after another."""
    n, streams = len(strips), b"".join(strips)
    at = at if at is not None else [sum(len(s) for s in strips[:i]) for i in range(n)]
    counts = counts if counts is not None else [len(s) for s in strips]
    data_at = 8 + 8 * n  # in the blob: 2 bytes of padding, BitsPerSample, the two arrays, then the streams
    offsets = [16 + data_at + a for a in at]
    blob = bytes(2) + struct.pack("<HHH", 8, 8, 8) + struct.pack(f"<{n}I", *offsets) + struct.pack(f"<{n}I", *counts)
    entries = [
        (256, 4, 1, width), (257, 4, 1, rows * n), (258, 3, 3, -2), (259, 3, 1, 7), (262, 3, 1, 6),
        (273, 4, n, -8) if n > 1 else (273, 4, 1, offsets[0]), (277, 3, 1, 3), (278, 4, 1, rows),
        (279, 4, n, -(8 + 4 * n)) if n > 1 else (279, 4, 1, counts[0]), (284, 3, 1, 1), (530, 3, 2, 2 | (2 << 16)),
    ]  # fmt: skip
    return _tiff(entries, blob + streams)


def test_a_jpeg_in_tiff_strip_over_the_scan_limit_is_refused_before_libtiff(monkeypatch) -> None:
    # 80 scans in one strip: the pre-scan refuses it (413) as it refuses a JPEG file of 80 scans.
    # libtiff's own cap (100 scans) is set to the JPEG scan limit too: without the pre-scan, the
    # same file fails in libtiff after 64 scans (415), where its default would decode them all.
    bomb = _jpeg_tiff([_progressive_strip((64, 64), 70)], 64, 64)
    assert count_scans(_progressive_strip((64, 64), 70)) == 80
    with pytest.raises(PayloadTooLarge, match="TIFF image's JPEG strip has more than 64 scans"):
        decode_image(bomb, color_mode="RGB", max_pixels=10**6)
    ok = decode_image(_jpeg_tiff([_progressive_strip((64, 64))], 64, 64), color_mode="RGB", max_pixels=10**6)
    assert ok.image.size == (64, 64)
    monkeypatch.setattr("service.imaging.images.prescan", lambda data, limits: None)
    with pytest.raises(InvalidImage):
        decode_image(bomb, color_mode="RGB", max_pixels=10**6)


def test_jpeg_in_tiff_work_is_the_jpeg_budget_summed_over_strips() -> None:
    # A reviewer's 36-megapixel JPEG-in-TIFF of 60 scans (215 KB) cost 1.0 s of libjpeg's CPU and
    # decoded, where the same stream as a JPEG file is refused at 28 scans: now it is refused alike.
    side, strip = 6000, scan_bomb(repeats=20)  # 30 scans of 36 MP, 1.08e9 scan pixels: over 1e9
    with pytest.raises(PayloadTooLarge, match="JPEG strip has at least 28 scans of 36000000 pixels, more work"):
        prescan(_jpeg_tiff([strip], side, side), LIMITS)
    # Four 64x16 strips of 10 scans each: 4 x 10 x 1024 = 40,960 scan pixels for the whole image.
    strips = [_progressive_strip((64, 16)) for _ in range(4)]
    assert [count_scans(s) for s in strips] == [10] * 4
    data = _jpeg_tiff(strips, 64, 16)
    decoded = decode_image(data, color_mode="RGB", max_pixels=10**6, limits=PrescanLimits(max_jpeg_scan_pixels=40_960))
    alone = np.asarray(Image.open(io.BytesIO(strips[0])).convert("RGB"), np.int16)  # each strip's own pixels
    assert np.abs(np.asarray(decoded.image, np.int16) - np.concatenate([alone] * 4)).mean() < 2
    with pytest.raises(PayloadTooLarge, match=r"10 scans of 1024 pixels \(beside 30720 scan pixels in the image's"):
        prescan(data, PrescanLimits(max_jpeg_scan_pixels=40_959))


def test_a_jpeg_strip_named_by_several_offsets_counts_once_per_offset_and_overlaps_are_refused() -> None:
    strip = _progressive_strip((64, 16))
    shared = _jpeg_tiff([strip] * 4, 64, 16, at=[0] * 4)  # libtiff decodes the one stream four times
    limits = PrescanLimits(max_jpeg_scan_pixels=40_960)
    assert decode_image(shared, color_mode="RGB", max_pixels=10**6, limits=limits).image.size == (64, 64)
    with pytest.raises(PayloadTooLarge, match="JPEG strips take 40960 scan pixels to decode, more than the limit"):
        prescan(shared, PrescanLimits(max_jpeg_scan_pixels=40_959))
    # Byte counts that run over the next strips: the walk would read the same bytes again for each.
    whole = 4 * len(strip)
    overlapping = _jpeg_tiff([strip] * 4, 64, 16, counts=[whole - i * len(strip) for i in range(4)])
    with pytest.raises(PayloadTooLarge, match="JPEG strips or tiles overlap"):
        prescan(overlapping, LIMITS)


def test_an_icon_larger_than_256_is_refused_before_pillow_decodes_it_while_opening() -> None:
    bomb = ico_png_bomb(300)
    with Image.open(io.BytesIO(bomb)) as image:  # what the pre-scan prevents: decoded by open itself
        assert image.size == (300, 300) and image._im is not None
    with pytest.raises(PayloadTooLarge, match="embeds a 300x300 image"):
        decode_image(bomb, color_mode="RGB", max_pixels=10**6)
    # The same for an embedded BMP (its header's height counts the AND mask's rows: 600 for 300).
    dib = struct.pack("<IiiHHIIiiII", 40, 300, 600, 1, 32, 0, 0, 0, 0, 0, 0) + bytes(300 * 300 * 4 + 40 * 300)
    with pytest.raises(PayloadTooLarge, match="embeds a 300x300 image"):
        prescan(_ico([dib], [0]), LIMITS)
    # The largest an icon can be passes, and a large image hidden in a smaller entry is found too.
    icon = io.BytesIO()
    Image.new("RGBA", (256, 256), (1, 2, 3, 255)).save(icon, "ICO", sizes=[(32, 32), (256, 256)])
    assert decode_image(icon.getvalue(), color_mode="RGB", max_pixels=10**6).image.size == (256, 256)
    small = io.BytesIO()
    Image.new("L", (16, 16), 9).save(small, "PNG")
    with pytest.raises(PayloadTooLarge, match="embeds a 300x300 image"):
        prescan(_ico([small.getvalue(), bomb[22:]], [16, 8]), LIMITS)


def test_a_bitmap_with_a_negative_width_or_no_rows_is_corrupt_not_a_bomb() -> None:
    # A fresh user's: width -64 was a 413 "declares 274877902848 pixels (a decompression bomb?)"
    for width, height in ((-64, 64), (0, 64), (64, 0)):
        data = bytearray(_bmp_rle8(64, 64, b"\x00\x01"))
        struct.pack_into("<iiHHI", data, 18, width, height, 1, 8, 0)  # uncompressed
        declared = f"corrupt: its header declares a width of {width} and a height of {height}"
        with pytest.raises(InvalidImage, match=declared):
            decode_image(bytes(data), color_mode="L", max_pixels=10**6)
    top_down = bytearray(_bmp_rle8(4, 4, b""))
    struct.pack_into("<iiHHI", top_down, 18, 4, -4, 1, 8, 0)
    top_down += bytes(16)  # its 4 rows of 4 bytes
    assert decode_image(bytes(top_down), color_mode="L", max_pixels=10**6).image.size == (4, 4)


def test_rle_bitmaps_are_bounded_in_pixels_and_in_opcodes() -> None:
    # A real RLE8 bitmap decodes as drawn: rows of runs of 255 and an end-of-line each.
    width, height = 640, 480
    row = b"\xff\x10\xff\x20\x82\x30" + b"\x00\x00"  # 255 px of 16, 255 of 32, 130 of 48
    decoded = decode_image(_bmp_rle8(width, height, row * height + b"\x00\x01"), color_mode="L", max_pixels=10**6)
    pixels = np.asarray(decoded.image)
    assert pixels.shape == (480, 640) and set(np.unique(pixels[:, 0])) == {16}
    assert (pixels[:, 255:510] == 32).all() and (pixels[:, 510:] == 48).all()
    # 1,048,576 pixels pass; one row more is refused. Runs of one pixel (2 bytes each) pass.
    prescan(_bmp_rle8(1024, 1024, b"\x00\x01"), LIMITS)
    with pytest.raises(PayloadTooLarge, match="run-length encoded with 1049600 pixels"):
        prescan(_bmp_rle8(1024, 1025, b"\x00\x01"), LIMITS)
    ones = (b"\x01\x07" * 100 + b"\x00\x00") * 100 + b"\x00\x01"
    assert np.asarray(decode_image(_bmp_rle8(100, 100, ones), color_mode="L", max_pixels=10**6).image).max() == 7
    # No-op opcodes before the pixels (a delta of 0, 0 each): more RLE data than the pixels need.
    with pytest.raises(PayloadTooLarge, match="bytes of RLE data for 10000 pixels"):
        prescan(_bmp_rle8(100, 100, b"\x00\x02\x00\x00" * 10_000 + ones), LIMITS)


def test_an_indexed_png_without_a_palette_is_refused() -> None:
    # Pillow decoded its indices as grey levels and answered 200 (a fresh user's find); PNG spec 11.2.3.
    indexed = io.BytesIO()
    Image.new("P", (8, 8), 3).save(indexed, "PNG")
    data = indexed.getvalue()
    prescan(data, LIMITS)
    start = data.index(b"PLTE") - 4
    (length,) = struct.unpack_from(">I", data, start)
    without = data[:start] + data[start + 12 + length :]
    with pytest.raises(InvalidImage, match="indexed-colour image without a PLTE chunk"):
        decode_image(without, color_mode="RGB", max_pixels=10**6)


def test_a_jpeg_strip_is_walked_as_libtiff_reads_it() -> None:
    # A second reviewer's ways past the strip walk (2026-12-05), each decoded by libtiff before.
    # A frame taller than its strip: 267 bytes that made libjpeg allocate +753 MiB at 6000x65500.
    with pytest.raises(PayloadTooLarge, match="declares a 64x200 frame, more than the 1024 pixels it holds"):
        prescan(_jpeg_tiff([_progressive_strip((64, 200))], 64, 16), LIMITS)
    # A byte count of 0: libtiff reads to the end of the file, and so does the walk.
    bomb = _progressive_strip((64, 64), 70)
    with pytest.raises(PayloadTooLarge, match="more than 64 scans"):
        prescan(_jpeg_tiff([bomb], 64, 64, counts=[0]), LIMITS)
    # Tiles beside strips: libtiff keeps the tag that comes last, so both are walked.
    harmless = _progressive_strip((64, 64))
    entries = [
        (256, 4, 1, 64), (257, 4, 1, 64), (258, 3, 3, -2), (259, 3, 1, 7), (262, 3, 1, 6),
        (273, 4, 1, 16 + 8), (277, 3, 1, 3), (279, 4, 1, len(harmless)), (284, 3, 1, 1),
        (322, 4, 1, 64), (323, 4, 1, 64), (324, 4, 1, 16 + 8 + len(harmless)), (325, 4, 1, len(bomb)),
        (530, 3, 2, 2 | (2 << 16)),
    ]  # fmt: skip
    with pytest.raises(PayloadTooLarge, match="more than 64 scans"):
        prescan(_tiff(entries, bytes(2) + struct.pack("<HHH", 8, 8, 8) + harmless + bomb), LIMITS)


def test_an_icons_images_are_walked_as_pillow_reads_them() -> None:
    # A second reviewer's ways past the first ICO check (2026-12-05).
    signature = b"\x89PNG\r\n\x1a\n"

    def ihdr(side: int, colour: int = 0) -> bytes:
        return _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, colour, 0, 0, 0))

    idat = _png_chunk(b"IDAT", zlib.compress(bytes(17 * 16))) + _png_chunk(b"IEND", b"")
    # An IHDR after another chunk, or a second IHDR: Pillow keeps the last, wherever it is.
    for png in (signature + _png_chunk(b"tEXt", b"a\0b") + ihdr(300) + idat, signature + ihdr(16) + ihdr(300) + idat):
        with pytest.raises(PayloadTooLarge, match="embeds a 300x300 image"):
            prescan(_ico([png], [16]), LIMITS)
    # The embedded PNG's chunks are counted as a PNG file's are (1.6 million empty chunks: 3.1 s).
    bomb = signature + ihdr(16) + _png_chunk(b"prIv", b"") * 10_001 + idat
    with pytest.raises(PayloadTooLarge, match="the ICO image's PNG image has more than 10000 chunks"):
        prescan(_ico([bomb], [16]), LIMITS)
    # An icon's BMP is uncompressed: an RLE one made Pillow read opcodes to the end of the file (18 MB: 2.8 s).
    rle = struct.pack("<IiiHHIIiiII", 40, 1, 2, 1, 8, 1, 0, 0, 0, 0, 0) + bytes(1024) + b"\x00\x00" * 1000
    with pytest.raises(InvalidImage, match="run-length-encoded BMP image"):
        prescan(_ico([rle], [1]), LIMITS)
    prescan(_ico([signature + ihdr(256) + idat], [0]), LIMITS)  # 256x256, the largest icon


def test_an_indexed_ihdr_anywhere_needs_its_palette() -> None:
    # Pillow keeps the last IHDR: a grey one then an indexed one, or one after a text chunk.
    signature = b"\x89PNG\r\n\x1a\n"
    grey, indexed = (_png_chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, c, 0, 0, 0)) for c in (0, 3))
    idat = _png_chunk(b"IDAT", zlib.compress(bytes(9 * 8))) + _png_chunk(b"IEND", b"")
    for png in (signature + grey + indexed + idat, signature + _png_chunk(b"tEXt", b"a\0b") + indexed + idat):
        with pytest.raises(InvalidImage, match="without a PLTE chunk"):
            prescan(png, LIMITS)
    prescan(signature + indexed + _png_chunk(b"PLTE", bytes(3)) + idat, LIMITS)


def test_a_third_reviewers_finds_are_refused() -> None:
    # Tiles far larger than the image: libtiff allocated a whole 16384x16384 tile for a 16x16 image (+771 MiB).
    def tiled(tile: int) -> bytes:
        entries = [
            (256, 4, 1, 16), (257, 4, 1, 16), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (277, 3, 1, 1), (322, 4, 1, tile), (323, 4, 1, tile), (324, 4, 1, 16), (325, 4, 1, 256),
        ]  # fmt: skip
        return _tiff(entries, bytes(256))

    with pytest.raises(PayloadTooLarge, match="16384x16384 tiles are far larger than the 16x16 image"):
        prescan(tiled(16384), LIMITS)
    prescan(tiled(256), LIMITS)  # libtiff's default tile on a small image
    # A second iCCP chunk, or one after the image data: Pillow inflated each (100 in 1.6 MB: 3.2 s).
    signature, png = b"\x89PNG\r\n\x1a\n", _png((8, 8))
    header, rest = png[: 8 + 25], png[8 + 25 :]
    profile = _png_chunk(b"iCCP", b"p\0\0" + zlib.compress(b"\0" * 1000))
    assert png.startswith(signature)
    prescan(header + profile + rest, LIMITS)
    for bad in (header + profile + profile + rest, header + rest[:-12] + profile + rest[-12:]):
        with pytest.raises(InvalidImage, match="a second iCCP chunk, or one after the image data"):
            prescan(bad, LIMITS)


def test_a_jpeg_of_several_scans_is_reserved_at_full_size() -> None:
    # A non-interleaved baseline JPEG (a scan per component) holds every coefficient like a progressive
    # one; at its draft size it reserved 625,681 pixels and held 40 million (a third reviewer's find).
    baseline = _jpeg((640, 480), quality=90)
    [(_, start, end)] = [s for s in _segments(baseline) if s[0] == 0xDA]
    two_scans = baseline[:end] + baseline[start:end] + baseline[end:]
    assert prescan(two_scans, LIMITS).multi_scan and not prescan(baseline, LIMITS).multi_scan
    assert open_image(baseline, color_mode="RGB", max_pixels=10**6, draft_size=(8, 8)).pixels == 80 * 60
    assert open_image(two_scans, color_mode="RGB", max_pixels=10**6, draft_size=(8, 8)).pixels == 640 * 480


def test_a_lossless_jpeg_is_decoded_at_full_size_when_a_draft_is_asked() -> None:
    # libjpeg cannot DCT-scale a lossless (SOF3) frame: with a draft size it was a 415 (a third reviewer's find).
    def segment(marker: int, body: bytes) -> bytes:
        return bytes((0xFF, marker)) + struct.pack(">H", len(body) + 2) + body

    side = 64
    lossless = b"\xff\xd8" + segment(
        0xC3, struct.pack(">BHHB", 8, side, side, 3) + b"\x01\x11\x00\x02\x11\x00\x03\x11\x00"
    )
    lossless += segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")  # one code: difference 0
    lossless += segment(0xDA, b"\x03\x01\x00\x02\x00\x03\x00\x01\x00\x00") + bytes(side * side * 3 // 8) + b"\xff\xd9"
    assert prescan(lossless, LIMITS).lossless
    opened = open_image(lossless, color_mode="RGB", max_pixels=10**6, draft_size=(8, 8))
    assert opened.pixels == side * side
    assert opened.decode().image.size == (side, side)


def test_an_avif_frame_larger_than_its_item_is_refused() -> None:
    # A third reviewer's: dav1d decodes the AV1 frame at its sequence header's size whatever the
    # item's ispe says (a 1,961-byte file, 12000x12000 in a 16x16 ispe: +298 MiB, 256 pixels reserved).
    def avif(mode: str, size: tuple[int, int]) -> bytes:
        buffer = io.BytesIO()
        Image.new(mode, size, (90, 120, 200, 128)[: len(mode)]).save(buffer, "AVIF", speed=10, quality=50)
        return buffer.getvalue()

    # The walk reads what libavif will: each coded item's ispe and its sequence header (colour and alpha).
    assert [(declared, bound.maximum) for declared, bound in coded_items(avif("RGBA", (33, 17)))] == [
        ((33, 17), (33, 17))
    ] * 2
    assert decode_image(avif("RGB", (33, 17)), color_mode="RGB", max_pixels=10**6).image.size == (33, 17)
    bomb = bytearray(avif("RGB", (256, 256)))
    at = bomb.index(b"ispe")
    struct.pack_into(">II", bomb, at + 8, 16, 16)
    with pytest.raises(PayloadTooLarge, match="AV1 frame is 256x256, larger than the 16x16 its item declares"):
        prescan(bytes(bomb), LIMITS)


def test_an_avif_sequence_whose_frames_are_larger_than_its_track_is_refused() -> None:
    # A fourth reviewer's: libavif sizes an image sequence by its track's tkhd and decodes the first
    # sample's frame at its own size (16x16 said, 12000x12000 decoded: +283 MiB, 256 pixels reserved).
    def sequence(mode: str, size: tuple[int, int]) -> bytes:
        frames = [Image.new(mode, size, (40 * i, 120, 200, 128)[: len(mode)]) for i in range(3)]
        buffer = io.BytesIO()
        frames[0].save(buffer, "AVIF", save_all=True, append_images=frames[1:], speed=10, quality=50)
        return buffer.getvalue()

    # What libavif reads: each AV1 track's size (colour and alpha) and its first frame's.
    tracks = sequence_tracks(sequence("RGBA", (33, 17)))
    assert [(declared, bound.maximum) for declared, bound in tracks] == [((33, 17), (33, 17))] * 2
    assert all(bound.codable == (64, 32) for _, bound in tracks)  # the fewest bits for 33 and 17: 6 and 5
    assert decode_image(sequence("RGB", (33, 17)), color_mode="RGB", max_pixels=10**6).image.size == (33, 17)
    legit = sequence("RGB", (256, 256))
    for patched in ("tkhd", "av01"):
        bomb = bytearray(legit)
        bomb[bomb.index(b"meta") : bomb.index(b"meta") + 4] = b"free"  # no item: the track alone is walked
        if patched == "tkhd":
            at = bomb.index(b"tkhd") + 4
            at += 4 + (32 if bomb[at] == 1 else 20) + 16 + 36
            struct.pack_into(">II", bomb, at, 16 << 16, 16 << 16)  # 16.16 fixed point
        else:
            entry = bomb.index(b"av01", bomb.index(b"stsd"))  # the sample entry, not ftyp's brand
            struct.pack_into(">HH", bomb, entry + 4 + 24, 16, 16)
        with pytest.raises(PayloadTooLarge, match="AV1 frame is 256x256, larger than the 16x16 its track declares"):
            prescan(bytes(bomb), LIMITS)
    assert not prescan(legit, LIMITS).multi_scan  # the same file unpatched passes


def test_the_avif_walks_cost_is_bounded_by_the_files_obus_and_header_bytes() -> None:
    # A sixth reviewer's: 1,024 items of four maximal sequence headers cost 1.16 s of Python walking.
    from service.imaging.prescan_av1 import ObuBudget

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 120, 200)).save(buffer, "AVIF", speed=10)
    assert len(coded_items(buffer.getvalue(), ObuBudget())) == 1
    with pytest.raises(PayloadTooLarge, match="bytes of AV1 sequence headers"):
        coded_items(buffer.getvalue(), ObuBudget(header_bytes=4))  # a header is about a dozen bytes
    with pytest.raises(PayloadTooLarge, match="AV1 OBUs in its items and tracks"):
        coded_items(buffer.getvalue(), ObuBudget(obus=1))


def test_a_fresh_users_ico_and_png_oddities_are_415s() -> None:
    # An ICO whose directory says 1000 entries around one zeroed entry: its offset 0 made the walk
    # read the ICO's own header as a bitmap's, and answer "embeds a 1000x0 image" (a 413).
    corrupt = b"\0\0\1\0" + struct.pack("<H", 1000) + bytes(16)
    with pytest.raises(InvalidImage, match="an image's offset points into its directory"):
        prescan(corrupt, LIMITS)
    # A PNG whose IHDR says interlace method 5 (0 or 1 only) was decoded and answered 200.
    png = bytearray(_png((8, 8)))
    png[8 + 8 + 12] = 5
    with pytest.raises(InvalidImage, match="compression, filter or interlace method"):
        prescan(bytes(png), LIMITS)
    png[8 + 8 + 12] = 1  # Adam7: defined
    prescan(bytes(png), LIMITS)
