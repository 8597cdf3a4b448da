"""Pre-scanning BMP and ICO files before Pillow opens them: the two ways they cost more than their size.

* **An icon decoded while it is opened.** Pillow's ICO plugin decodes the icon's largest image
  inside ``Image.open`` (``IcoImagePlugin._open`` calls ``load``), at the size the embedded PNG's
  or BMP's own header gives, not the directory's, so the server could count its pixels only after
  paying for them: a fresh user's ICO whose directory says 256x256 around a 155 KB 6324x6324 PNG,
  32 of them in one 5 MB request, took 23.6 s and +5.3 GiB though 28 were then refused. An
  ICONDIRENTRY holds each side in one byte (0 meaning 256: Microsoft, "Icons", ICO file format),
  so an icon's images are at most 256x256; an embedded image larger than that is refused (413).
  An embedded PNG is walked as a PNG file is (its chunks counted, every IHDR read: Pillow keeps
  the last), and an embedded BMP may not be run-length encoded (icons are uncompressed; Pillow's
  RLE decoder would read opcodes to the end of the file: 18 MB, 2.8 s).
* **RLE in Python.** Pillow's ``BmpRleDecoder`` (BI_RLE8, BI_RLE4) runs in Python: an opcode
  costs about 0.3 us, and an end-of-line pads the row one byte at a time (70-90 ns a pixel), so
  a 1 KB 40,000,000x1 strip took 3.7 s and a 26 KB 6324x6324 file of one pixel and an
  end-of-line per row 3.1 s. RLE is a palette format for small bitmaps: one is refused (413)
  above ``max_bmp_rle_pixels``, or when its RLE data is longer than any encoder writes for its
  pixels (2 bytes a pixel, a run of one; plus an end-of-line per row), which bounds the opcodes
  the decoder runs before the image is full. A 1-megapixel RLE bitmap then costs at most ~0.5 s.
"""

from __future__ import annotations

import struct

from service.core.errors import InvalidImage, PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits
from service.imaging.prescan_png import PNG_SIGNATURE, scan_png

BMP_SIGNATURE = b"BM"
ICO_SIGNATURE = b"\x00\x00\x01\x00"
_ICON_SIDE = 256  # an ICONDIRENTRY's one-byte width and height, 0 meaning 256
_RLE8, _RLE4 = 1, 2  # BITMAPINFOHEADER biCompression


def _dib(data: bytes, offset: int) -> tuple[int, int, int] | None:
    """An icon's BMP image at ``offset``: (width, height, compression) from its header, the height
    without the AND mask's rows (as Pillow halves it); None when there is no header there."""
    if offset + 12 > len(data):
        return None
    (header,) = struct.unpack_from("<I", data, offset)
    if header == 12:  # BITMAPCOREHEADER: never compressed
        width, height = struct.unpack_from("<HH", data, offset + 4)
        return width, height // 2, 0
    if header >= 40 and offset + 20 <= len(data):  # BITMAPINFOHEADER and its successors
        width, height, _, _, compression = struct.unpack_from("<iiHHI", data, offset + 4)
        return abs(width), abs(height) // 2, compression
    return None


def scan_ico(data: bytes, limits: PrescanLimits) -> None:
    """Refuse an ICO whose images an icon cannot hold (module docstring).

    Every directory entry's image is checked, each offset once (Pillow decodes the one its
    directory says is largest, which the directory may misstate): an embedded PNG's chunks are
    walked as a PNG file's are (:func:`~service.imaging.prescan_png.scan_png`, every IHDR
    counted, the chunk limit shared by all of them); an embedded BMP's header is read. Entries
    or images outside the data are Pillow's to report as corrupt.

    Raises:
        PayloadTooLarge: an embedded PNG or BMP wider or taller than 256 pixels; a PNG's limits
            (413).
        InvalidImage: a run-length-encoded BMP image (icons are uncompressed), an image whose
            offset points into the directory, or a PNG's structure Pillow would misread (415).
    """
    if len(data) < 6:
        return
    (count,) = struct.unpack_from("<H", data, 4)
    offsets = {struct.unpack_from("<I", data, 6 + 16 * i + 12)[0] for i in range(min(count, (len(data) - 6) // 16))}
    if any(offset < 6 + 16 * count for offset in offsets):  # its own header read as an image's (a "1000x0" image)
        raise InvalidImage("the ICO image is corrupt: an image's offset points into its directory")
    chunks = 0
    for offset in sorted(offsets):
        if data.startswith(PNG_SIGNATURE, offset):
            walk = scan_png(data, limits, start=offset, chunks=chunks, what="ICO image's PNG")
            chunks, size = walk.chunks, (walk.width, walk.height)
        else:
            dib = _dib(data, offset)
            if dib is None:
                continue
            if dib[2] in (_RLE8, _RLE4):  # Pillow's Python RLE decoder reads opcodes to the end of the file
                raise InvalidImage(
                    "the ICO image holds a run-length-encoded BMP image; an icon's BMP images are uncompressed "
                    "(Microsoft's ICO format): send it as PNG"
                )
            size = dib[:2]
        if max(size) > _ICON_SIDE:
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
        InvalidImage: a width that is not positive, or a height of 0 (415).
    """
    if len(data) < 34:
        return
    (pixel_data, header) = struct.unpack_from("<II", data, 10)
    if header < 40:  # an OS/2 BITMAPCOREHEADER: no compression field
        return
    width, height, _, _, compression = struct.unpack_from("<iiHHI", data, 18)
    if width <= 0 or height == 0:  # (a negative height is a top-down bitmap; Pillow read -64 as 2^32 - 64)
        raise InvalidImage(f"the BMP image is corrupt: its header declares a width of {width} and a height of {height}")
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
