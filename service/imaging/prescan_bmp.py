"""Pre-scanning BMP and ICO files before Pillow opens them: the two ways they cost more than their size.

* **An icon decoded while it is opened.** Pillow's ICO plugin decodes the icon's largest image
  inside ``Image.open`` (``IcoImagePlugin._open`` calls ``load``), at the size the embedded PNG's
  or BMP's own header gives, not the directory's, so the server could count its pixels only after
  paying for them: a fresh user's ICO whose directory says 256x256 around a 155 KB 6324x6324 PNG,
  32 of them in one 5 MB request, took 23.6 s and +5.3 GiB though 28 were then refused. An
  ICONDIRENTRY holds each side in one byte (0 meaning 256: Microsoft, "Icons", ICO file format),
  so an icon's images are at most 256x256; an embedded image larger than that is refused (413).
* **RLE in Python.** Pillow's ``BmpRleDecoder`` (BI_RLE8, BI_RLE4) runs in Python: an opcode
  costs about 0.3 us, and an end-of-line pads the row one byte at a time (70-90 ns a pixel), so
  a 1 KB 40,000,000x1 strip took 3.7 s and a 26 KB 6324x6324 file of one pixel and an
  end-of-line per row 3.1 s. RLE is a palette format for small bitmaps: one is refused (413)
  above ``max_bmp_rle_pixels``, or when its RLE data is longer than any encoder writes for its
  pixels (2 bytes a pixel, a run of one; plus an end-of-line per row), which bounds the opcodes
  the decoder runs before the image is full. A 1-megapixel RLE bitmap then costs at most ~0.4 s.
"""

from __future__ import annotations

import struct

from service.core.errors import PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits

BMP_SIGNATURE = b"BM"
ICO_SIGNATURE = b"\x00\x00\x01\x00"
_PNG = b"\x89PNG\r\n\x1a\n"
_ICON_SIDE = 256  # an ICONDIRENTRY's one-byte width and height, 0 meaning 256
_RLE8, _RLE4 = 1, 2  # BITMAPINFOHEADER biCompression


def _embedded_size(data: bytes, offset: int) -> tuple[int, int] | None:
    """The size an icon's image at ``offset`` decodes to, from its PNG IHDR or its BMP header (the
    BMP's height counts the AND mask's rows too, as Pillow halves it); None when it is not there."""
    if data.startswith(_PNG, offset):
        if offset + 24 > len(data):
            return None
        width, height = struct.unpack_from(">II", data, offset + 16)
        return width, height
    if offset + 12 > len(data):
        return None
    (header,) = struct.unpack_from("<I", data, offset)
    if header == 12:  # BITMAPCOREHEADER
        width, height = struct.unpack_from("<HH", data, offset + 4)
    elif header >= 40 and offset + 12 <= len(data):  # BITMAPINFOHEADER and its successors
        width, height = struct.unpack_from("<ii", data, offset + 4)
    else:
        return None
    return abs(width), abs(height) // 2


def scan_ico(data: bytes, limits: PrescanLimits) -> None:
    """Refuse an ICO that embeds an image larger than an icon's 256x256 (module docstring).

    Every directory entry's image is checked (Pillow decodes the one its directory says is
    largest, which the directory may misstate). Entries or images outside the data are Pillow's
    to report as corrupt.

    Raises:
        PayloadTooLarge: an embedded PNG or BMP wider or taller than 256 pixels (413).
    """
    if len(data) < 6:
        return
    (count,) = struct.unpack_from("<H", data, 4)
    for entry in range(min(count, (len(data) - 6) // 16)):
        (offset,) = struct.unpack_from("<I", data, 6 + 16 * entry + 12)
        size = _embedded_size(data, offset)
        if size is not None and max(size) > _ICON_SIDE:
            raise PayloadTooLarge(
                f"the ICO image embeds a {size[0]}x{size[1]} image; an icon's images are at most "
                f"{_ICON_SIDE}x{_ICON_SIDE} (its directory cannot say more), and Pillow decodes it while opening "
                "the file, before its pixels can be counted: send it as PNG"
            )


def scan_bmp(data: bytes, limits: PrescanLimits) -> None:
    """Refuse a run-length-encoded BMP that Pillow's Python decoder would spend seconds on (module docstring).

    Raises:
        PayloadTooLarge: an RLE8 or RLE4 bitmap of more than ``limits.max_bmp_rle_pixels`` pixels, or
            with more RLE data than 2 bytes a pixel and 2 a row (413).
    """
    if len(data) < 34:
        return
    (pixel_data, header) = struct.unpack_from("<II", data, 10)
    if header < 40:  # an OS/2 BITMAPCOREHEADER: no compression field
        return
    width, height, _, _, compression = struct.unpack_from("<iiHHI", data, 18)
    if compression not in (_RLE8, _RLE4):
        return
    pixels, rows = abs(width) * abs(height), abs(height)
    if pixels > limits.max_bmp_rle_pixels:
        raise PayloadTooLarge(
            f"the BMP image is run-length encoded with {pixels} pixels, more than {limits.max_bmp_rle_pixels} "
            "(PATCHSERVE_MAX_BMP_RLE_PIXELS): its decoder runs in Python, a pixel at a time; send it as PNG"
        )
    rle = len(data) - pixel_data
    if rle > 2 * pixels + 2 * rows + 2:
        raise PayloadTooLarge(
            f"the BMP image holds {rle} bytes of RLE data for {pixels} pixels, more than any encoder writes "
            "(2 bytes a pixel and an end-of-line a row): a decoding bomb?"
        )
