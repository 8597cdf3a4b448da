"""The picture as displayed: EXIF orientation, and any Pillow mode to the model's colour mode.

CMYK, 16-bit, palette, alpha and 1-bit images all reach ``"L"`` or ``"RGB"`` here, transparent
pixels composited onto a background; the EXIF orientation (1-8, tag 0x0112) is read here and
applied as :data:`DISPLAY_TRANSPOSE` says.
"""

from __future__ import annotations

import logging
import struct

import numpy as np
from PIL import Image, ImageFile

from service.core.errors import InvalidImage

log = logging.getLogger(__name__)

# EXIF orientation (tag 0x0112) -> the transposition that displays the stored pixels, as
# ImageOps.exif_transpose applies it. 5-8 turn by 90 degrees: width and height swap.
DISPLAY_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}
_HIGH_DEPTH_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


def _exif_too_costly(exif: bytes, max_tags: int) -> bool:
    """Whether Pillow's EXIF parser would spend far more than a camera's EXIF costs: a first IFD of
    more than ``max_tags`` entries, or an orientation entry (0x0112) of more than one value (Pillow
    makes an object of each when the tag is read: 1.9 million rationals, 2 s and +293 MiB).
    The block is a TIFF structure, maybe after ``Exif\\0\\0``; an unreadable one is left to Pillow."""
    data = memoryview(exif)[6:] if exif.startswith(b"Exif\x00\x00") else memoryview(exif)
    if len(data) < 8 or bytes(data[:2]) not in (b"II", b"MM"):
        return False
    order = "<" if bytes(data[:2]) == b"II" else ">"
    (offset,) = struct.unpack_from(order + "I", data, 4)
    if offset > len(data) - 2:  # Pillow reads the IFD at any offset, 0-7 (the header itself) included
        return False
    (entries,) = struct.unpack_from(order + "H", data, offset)
    if entries > max_tags:
        return True
    for entry in range(min(entries, (len(data) - offset - 2) // 12)):
        tag, _, count = struct.unpack_from(order + "HHI", data, offset + 2 + 12 * entry)
        if tag == 0x0112 and count != 1:
            return True
    return False


def orientation(image: Image.Image, max_tags: int) -> int:
    """The EXIF orientation (1-8); 1 when absent, out of range or unreadable.

    An EXIF block (a JPEG's APP1, a PNG's eXIf or "Raw profile type exif" text, a WebP's EXIF
    chunk) whose first IFD holds more than ``max_tags`` entries (``PATCHSERVE_MAX_TIFF_TAGS``, as a
    TIFF's), or whose orientation entry holds more than one value, is not parsed and counts as
    absent: Pillow parses every entry in Python (65,535 in a 786 KB PNG or WebP: 0.16-0.2 s, a
    fresh user's find), and no camera writes more than about a hundred.
    """
    exif, raw = image.info.get("exif"), image.info.get("Raw profile type exif")
    if exif is None and isinstance(raw, str):  # ImageMagick's PNG text chunk, which Pillow's getexif reads
        try:
            exif = bytes.fromhex("".join(raw.split("\n")[3:]))
        except ValueError:
            exif = None
    if isinstance(exif, bytes) and _exif_too_costly(exif, max_tags):
        log.debug("an EXIF block of more than %d entries, or a many-valued orientation, ignored", max_tags)
        return 1
    try:
        value = image.getexif().get(0x0112, 1)
    except Exception:  # a malformed EXIF block must not lose an otherwise good photo
        log.debug("unreadable EXIF ignored", exc_info=True)
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _sample_bits(image: Image.Image) -> int | None:
    """The bits per sample the file declares, where its format says (TIFF's tag 258; PNG's deepest is 16)."""
    if image.format == "PNG":
        return 16
    tags = getattr(image, "tag_v2", None)
    bits = tags.get(258) if tags is not None else None
    if isinstance(bits, tuple):
        bits = max(bits, default=None)
    return bits if isinstance(bits, int) else None


def check_depth(image: Image.Image, name: str) -> None:
    """Refuse 32-bit integer and floating-point pixels, from the header, before they are decoded.

    Their range is the file's own convention (a float TIFF may hold 0-1, 0-255 or radiance, an
    int32 one 0-255 or 0-2**31), so any rescaling to 8 bits would be a guess: a 32-bit TIFF of
    0-255 values came out nearly black. 1-, 8- and 16-bit images are decoded; Pillow's mode
    ``"I"`` is taken only where the file declares 16-bit samples (a signed 16-bit TIFF).

    Args:
        image: the opened file (its header read), with its mode and format.
        name: the format's name, for the message.

    Raises:
        InvalidImage: a float ("F") or 32-bit integer ("I", "I;32...") image (415).
    """
    mode = image.mode
    if mode == "F":
        kind = "32-bit floating-point"
    elif mode.startswith("I;32") or (mode == "I" and _sample_bits(image) != 16):
        kind = "32-bit integer"
    else:
        return
    raise InvalidImage(
        f"the {name} image has {kind} pixels (mode {mode!r}), whose range this server cannot know; "
        "it decodes 1-, 8- and 16-bit images: convert it to 8 or 16 bits per sample"
    )


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit single-channel modes -> "L" (or "LA" with a tRNS key), rescaled.

    Pillow's own ``convert("L")`` clips these (every value above 255 turns white). Here they
    are read as 16-bit (0-65535) and divided by 257 with rounding, so 65535 -> 255 and
    32768 -> 128 (a signed 16-bit TIFF's negative values are 0). 32-bit and float images never
    get here (:func:`check_depth`).
    """
    pixels = np.asarray(image)  # (H, W) uint16, or int32 holding 16-bit values
    # In integers, one 4-byte copy: (x + 128) // 257 is x / 257 rounded (257 is odd: no ties).
    # Float32 copies and an int64 mask held 13-18 bytes a pixel at peak (a fresh user's 40 MP file).
    wide = (np.clip(pixels, 0, 65535) if pixels.dtype.kind == "i" else pixels).astype(np.uint32)
    wide += 128
    wide //= 257
    gray = Image.fromarray(wide.astype(np.uint8))
    del wide
    key = image.info.get("transparency")
    if isinstance(key, int):
        alpha = np.full(pixels.shape, 255, np.uint8)
        alpha[pixels == key] = 0
        return Image.merge("LA", (gray, Image.fromarray(alpha)))
    return gray


def rescale_grey_key(image: ImageFile.ImageFile) -> None:
    """Give a 2- or 4-bit grey PNG's colour key (tRNS) the 0-255 scale its pixels are decoded to.

    Pillow decodes such a PNG to mode "L", each sample scaled to 0-255 (2 bits: x 85, 4 bits:
    x 17), but keeps the tRNS key in the file's own depth (PNG spec, 11.3.2.1), so the key of
    white in a 2-bit file, 3, matched no pixel and its transparent pixels stayed white. Call on
    the opened file, before it is decoded (the decoder's raw mode names the depth).
    """
    key = image.info.get("transparency")
    if image.format != "PNG" or image.mode != "L" or not isinstance(key, int) or not image.tile:
        return
    rawmode = image.tile[0].args
    bits = {"L;2": 2, "L;4": 4}.get(rawmode[:3]) if isinstance(rawmode, str) else None
    if bits is not None:
        image.info["transparency"] = key * 255 // ((1 << bits) - 1)


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in _ALPHA_MODES or (image.mode in ("P", "1", "L", "RGB") and "transparency" in image.info)


def to_mode(image: Image.Image, color_mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Any Pillow mode -> ``color_mode`` ("L" or "RGB"), alpha composited onto ``background``."""
    if image.mode in _HIGH_DEPTH_MODES:
        image = _to_8bit(image)
    if _has_transparency(image):
        if image.mode == "La":
            image = image.convert("LA")
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba).convert("RGB")
    if image.mode not in ("L", "RGB") and color_mode == "L":
        image = image.convert("RGB")  # CMYK, YCbCr, ... reach L through RGB
    return image.convert(color_mode) if image.mode != color_mode else image
