"""Image files the committed copy (tests/images) lacks, generated with Pillow (or byte by byte
where Pillow cannot write the kind), each with the answer the server must give.

Bombs are written by hand: a header that declares a huge image over a few bytes of data, or
(``png_warn_bomb``) a real zlib stream that would inflate to 90 Mpx, so no test ever holds the
pixels it describes.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

# Pillow's default DecompressionBombWarning threshold (it raises only above twice this).
PILLOW_WARN_PIXELS = 1024 * 1024 * 1024 // 4 // 3


@dataclass(frozen=True)
class Case:
    """One file and the answer expected for it (vit-digits, default settings).

    Attributes:
        data: the file's bytes.
        status: the HTTP status of a one-image request.
        size: (width, height) reported for a decodable image, as displayed.
        detail: a part of the problem's detail (for errors).
    """

    data: bytes
    status: int
    size: tuple[int, int] | None = None
    detail: str = ""


def save(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def pattern(width: int = 48, height: int = 32) -> np.ndarray:
    """An asymmetric uint8 (H, W) image: four quadrants of distinct grey levels and a bright
    top-left block, so every flip and rotation of it is distinguishable."""
    pixels = np.zeros((height, width), np.uint8)
    h2, w2 = height // 2, width // 2
    pixels[:h2, :w2], pixels[:h2, w2:], pixels[h2:, :w2], pixels[h2:, w2:] = 40, 100, 160, 220
    pixels[: h2 // 2, : w2 // 2] = 255
    return pixels


# The EXIF 2.32 definition of tag 0x0112: the stored array -> the displayed one, in numpy,
# independent of Pillow's transposition table.
DISPLAY = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.T,
    6: lambda a: np.rot90(a, -1),
    7: lambda a: np.rot90(a, 2).T,
    8: lambda a: np.rot90(a, 1),
}
# Its inverse: what to store so that the displayed image is ``a``.
STORE = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.T,
    6: lambda a: np.rot90(a, 1),
    7: lambda a: np.rot90(a.T, 2),
    8: lambda a: np.rot90(a, -1),
}


def with_orientation(displayed: np.ndarray, orientation: int, fmt: str = "JPEG") -> bytes:
    """A file whose stored pixels, shown per EXIF ``orientation``, are ``displayed``."""
    image = Image.fromarray(np.ascontiguousarray(STORE[orientation](displayed)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    params: dict[str, object] = {"exif": exif}
    if fmt == "JPEG":
        params["quality"] = 95
    if fmt == "TIFF":  # TIFF keeps the orientation in its own first IFD, tag 274
        params = {"tiffinfo": {0x0112: orientation}}
    return save(image, fmt, **params)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png(width: int, height: int, *, bit_depth: int, color_type: int, idat: bytes) -> bytes:
    """A PNG from its parts (color_type 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def png16(pixels: np.ndarray) -> bytes:
    """uint16 (H, W) or (H, W, 3) -> a 16-bit PNG (Pillow writes only 16-bit grayscale)."""
    height, width = pixels.shape[:2]
    rows = pixels.astype(">u2").reshape(height, -1).view(np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    return png(width, height, bit_depth=16, color_type=0 if pixels.ndim == 2 else 2, idat=zlib.compress(raw))


def png_zero_bomb(width: int, height: int) -> bytes:
    """An 8-bit grayscale PNG of ``width`` x ``height`` zeros: a real zlib stream (~1000:1)."""
    compressor = zlib.compressobj(9)
    row = bytes(width + 1)
    parts = [compressor.compress(row) for _ in range(height)]
    parts.append(compressor.flush())
    return png(width, height, bit_depth=8, color_type=0, idat=b"".join(parts))


def tiff(width: int, height: int, *, samples: int, bits: int, data: bytes) -> bytes:
    """A little-endian, uncompressed, one-strip TIFF (Pillow cannot write 16-bit RGB)."""
    entries = [
        (256, 4, 1, width),  # ImageWidth (LONG)
        (257, 4, 1, height),  # ImageLength
        (258, 3, 1, bits),  # BitsPerSample (SHORT; one value, read for every sample)
        (259, 3, 1, 1),  # Compression: none
        (262, 3, 1, 2 if samples == 3 else 1),  # PhotometricInterpretation: RGB or BlackIsZero
        (273, 4, 1, 0),  # StripOffsets, patched below
        (277, 3, 1, samples),  # SamplesPerPixel
        (278, 4, 1, height),  # RowsPerStrip
        (279, 4, 1, len(data)),  # StripByteCounts
        (284, 3, 1, 1),  # PlanarConfiguration: chunky
    ]
    if samples == 3 and bits != 8:
        entries[2] = (258, 3, 3, 0)  # BitsPerSample: three SHORTs, stored after the IFD
    ifd_size = 2 + 12 * len(entries) + 4
    extra = struct.pack("<3H", bits, bits, bits) if samples == 3 and bits != 8 else b""
    data_offset = 8 + ifd_size + len(extra)
    out = [b"II*\x00", struct.pack("<I", 8), struct.pack("<H", len(entries))]
    for tag, kind, count, value in entries:
        if tag == 273:
            value = data_offset
        if tag == 258 and count == 3:
            value = 8 + ifd_size
        packed = struct.pack("<HH", value, 0) if kind == 3 and count == 1 else struct.pack("<I", value)
        out.append(struct.pack("<HHI", tag, kind, count) + packed)
    out.append(struct.pack("<I", 0))
    return b"".join(out) + extra + data


def gif_extent_bomb() -> bytes:
    """A GIF whose 16x16 screen holds a first frame declared 30000x30000 (Pillow enlarges the
    image to the frame's extent)."""
    header = b"GIF89a" + struct.pack("<HHBBB", 16, 16, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    descriptor = b"," + struct.pack("<HHHHB", 0, 0, 30000, 30000, 0)
    return header + descriptor + b"\x02\x02\x44\x01\x00;"


def ico_with(entry: bytes, declared: int = 0) -> bytes:
    """An ICO with one entry (``declared`` 0 means 256x256 in its directory) holding ``entry``."""
    directory = struct.pack("<BBBBHHII", declared, declared, 0, 0, 1, 32, len(entry), 22)
    return struct.pack("<HHH", 0, 1, 1) + directory + entry


def dib_header(width: int, height: int) -> bytes:
    """A BITMAPINFOHEADER for a 32-bit DIB (an ICO entry stores twice the height: XOR + AND)."""
    return struct.pack("<IiiHHIIiiII", 40, width, 2 * height, 1, 32, 0, 0, 0, 0, 0, 0) + bytes(64)


def jpeg_header_bomb() -> bytes:
    """A JPEG whose SOF0 declares 60000x60000 over no scan data."""
    base = save(Image.new("L", (8, 8)), "JPEG")
    sof = base.index(b"\xff\xc0")
    return base[: sof + 5] + struct.pack(">HH", 60000, 60000) + base[sof + 9 :]


def webp_canvas_bomb() -> bytes:
    """A WebP whose VP8X canvas is 16384x16384 around a 1x1 frame."""
    frame = save(Image.new("RGB", (1, 1)), "WEBP", lossless=True)[12:]  # the VP8L chunk
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" + (16383).to_bytes(3, "little") * 2
    body = b"WEBP" + vp8x + frame
    return b"RIFF" + struct.pack("<I", len(body)) + body


def ycck_jpeg(cmyk: tuple[int, int, int, int], size: tuple[int, int] = (16, 16)) -> bytes:
    """A YCCK JPEG (Adobe APP14 transform 2) that decodes to the CMYK colour ``cmyk``.

    Pillow writes CMYK JPEGs inverted, with transform 0; libjpeg turns YCCK back into CMYK as
    (255 - R, 255 - G, 255 - B, K) and Pillow inverts that again, so storing YCbCr(c, m, y) and
    k (each inverted by Pillow's writer) yields (c, m, y, k) after decoding.
    """
    width, height = size
    ycc = np.asarray(Image.new("RGB", size, cmyk[:3]).convert("YCbCr"))
    planes = np.dstack([255 - ycc, np.full((height, width), cmyk[3], np.uint8)]).astype(np.uint8)
    data = bytearray(save(Image.fromarray(planes, "CMYK"), "JPEG", quality=100))
    adobe = data.index(b"Adobe")
    data[adobe + 11] = 2  # APP14: "Adobe", version, flags0, flags1, transform
    return bytes(data)


def animated(fmt: str, colours: list[tuple[int, int, int]], size: tuple[int, int] = (24, 16)) -> bytes:
    frames = [Image.new("RGB", size, colour) for colour in colours]
    params: dict[str, object] = {"save_all": True, "append_images": frames[1:], "duration": 100, "loop": 0}
    if fmt == "WEBP":
        params["lossless"] = True
    return save(frames[0], fmt, **params)


def truncated(data: bytes, keep: float = 0.6) -> bytes:
    return data[: int(len(data) * keep)]


def _rgba(alpha: int) -> Image.Image:
    pixels = np.zeros((20, 30, 4), np.uint8)
    pixels[..., 0] = 200
    pixels[..., 3] = alpha
    return Image.fromarray(pixels, "RGBA")


def _gradient16() -> np.ndarray:
    return np.linspace(0, 65535, 64 * 48).reshape(48, 64).astype(np.uint16)


def _builders() -> dict[str, Callable[[], Case]]:
    digit = np.kron(np.eye(4, dtype=np.uint8) * 255, np.ones((4, 4), np.uint8))  # 16x16
    builders: dict[str, Callable[[], Case]] = {}
    for o in range(1, 9):
        builders[f"exif-orientation-{o}.jpg"] = lambda o=o: Case(with_orientation(pattern(), o), 200, (48, 32))
    builders.update(
        {
            "exif-orientation-6.tif": lambda: Case(with_orientation(pattern(), 6, "TIFF"), 200, (48, 32)),
            "exif-orientation-8.webp": lambda: Case(with_orientation(pattern(), 8, "WEBP"), 200, (48, 32)),
            "16bit-gray.png": lambda: Case(png16(_gradient16()), 200, (64, 48)),
            "16bit-rgb.png": lambda: Case(png16(np.dstack([_gradient16()] * 3)), 200, (64, 48)),
            "16bit-gray.tif": lambda: Case(save(Image.fromarray(_gradient16()), "TIFF"), 200, (64, 48)),
            "16bit-rgb.tif": lambda: Case(
                tiff(64, 48, samples=3, bits=16, data=np.dstack([_gradient16()] * 3).astype("<u2").tobytes()),
                200,
                (64, 48),
            ),
            "cmyk.jpg": lambda: Case(save(Image.new("CMYK", (16, 12), (0, 200, 255, 0)), "JPEG"), 200, (16, 12)),
            "ycck.jpg": lambda: Case(ycck_jpeg((0, 200, 255, 0)), 200, (16, 16)),
            "progressive.jpg": lambda: Case(
                save(Image.fromarray(pattern()), "JPEG", progressive=True, quality=90), 200, (48, 32)
            ),
            "grayscale.png": lambda: Case(save(Image.fromarray(digit), "PNG"), 200, (16, 16)),
            "1bit.png": lambda: Case(save(Image.fromarray(digit).convert("1"), "PNG"), 200, (16, 16)),
            "1bit.bmp": lambda: Case(save(Image.fromarray(digit).convert("1"), "BMP"), 200, (16, 16)),
            "1bit-g4.tif": lambda: Case(
                save(Image.fromarray(digit).convert("1"), "TIFF", compression="group4"), 200, (16, 16)
            ),
            "la.png": lambda: Case(save(Image.fromarray(np.dstack([digit, digit])), "PNG"), 200, (16, 16)),
            "rgba-transparent.png": lambda: Case(save(_rgba(0), "PNG"), 200, (30, 20)),
            "palette-transparent.gif": lambda: Case(
                save(Image.fromarray(digit).convert("P"), "GIF", transparency=0), 200, (16, 16)
            ),
            "rgba-lossless.webp": lambda: Case(save(_rgba(128), "WEBP", lossless=True), 200, (30, 20)),
            "animated.gif": lambda: Case(animated("GIF", [(255, 0, 0), (0, 0, 255)]), 200, (24, 16)),
            "animated.webp": lambda: Case(animated("WEBP", [(255, 0, 0), (0, 0, 255)]), 200, (24, 16)),
            "icon.ico": lambda: Case(
                save(Image.fromarray(digit).resize((48, 48)), "ICO", sizes=[(16, 16), (48, 48)]), 200, (48, 48)
            ),
            "stereo.mpo": lambda: Case(
                save(
                    Image.new("RGB", (40, 30), (255, 0, 0)),
                    "MPO",
                    save_all=True,
                    append_images=[Image.new("RGB", (40, 30), (0, 0, 255))],
                ),
                200,
                (40, 30),
            ),
            "photo.avif": lambda: Case(save(Image.fromarray(pattern()).convert("RGB"), "AVIF"), 200, (48, 32)),
            # Decompression bombs and oversized headers: 413 before any pixel is decoded.
            "bomb-pillow-only-warns.png": lambda: Case(png_zero_bomb(10_000, 9_000), 413, detail="90000000 pixels"),
            "bomb-header.png": lambda: Case(
                png(100_000, 100_000, bit_depth=8, color_type=0, idat=zlib.compress(b"\0" * 64)), 413
            ),
            "bomb.tif": lambda: Case(tiff(50_000, 50_000, samples=1, bits=8, data=bytes(64)), 413),
            "bomb-frame-extent.gif": lambda: Case(gif_extent_bomb(), 413),
            "bomb-header.jpg": lambda: Case(jpeg_header_bomb(), 413),
            "bomb-embedded-png.ico": lambda: Case(
                ico_with(png(10_000, 10_000, bit_depth=8, color_type=0, idat=zlib.compress(b"\0" * 64))), 413
            ),
            "bomb-embedded-dib.ico": lambda: Case(ico_with(dib_header(20_000, 20_000)), 413),
            "bomb-canvas.webp": lambda: Case(webp_canvas_bomb(), 413),
            # Truncated and corrupt files: 415, naming the format and the fault.
            "truncated.png": lambda: Case(truncated(save(Image.fromarray(pattern()), "PNG")), 415, detail="PNG"),
            "truncated.gif": lambda: Case(truncated(save(Image.fromarray(pattern()), "GIF")), 415, detail="GIF"),
            "truncated.webp": lambda: Case(truncated(save(Image.fromarray(pattern()), "WEBP")), 415, detail="WebP"),
            "truncated.tif": lambda: Case(truncated(save(Image.fromarray(pattern()), "TIFF")), 415, detail="TIFF"),
            "truncated.bmp": lambda: Case(truncated(save(Image.fromarray(pattern()), "BMP")), 415, detail="BMP"),
            "truncated-progressive.jpg": lambda: Case(
                truncated(save(Image.fromarray(pattern()), "JPEG", progressive=True)), 415, detail="truncated"
            ),
            "zero-width.png": lambda: Case(png(0, 8, bit_depth=8, color_type=0, idat=zlib.compress(b"")), 415),
            # Formats that are not accepted: 415 naming them (EPS would otherwise run Ghostscript).
            "document.pdf": lambda: Case(b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n", 415, detail="PDF"),
            "drawing.svg": lambda: Case(
                b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>', 415, detail="SVG"
            ),
            "figure.eps": lambda: Case(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n", 415, detail="EPS"),
            "layers.psd": lambda: Case(b"8BPS\x00\x01" + bytes(40), 415, detail="PSD"),
            "notes.txt": lambda: Case(b"hello, this is text", 415, detail="not an image"),
        }
    )
    return builders


GENERATED = _builders()
