"""The picture as displayed: EXIF orientation, and any Pillow mode to the model's colour mode.

CMYK, 16-bit, palette, alpha and 1-bit images all reach ``"L"`` or ``"RGB"`` here, transparent
pixels composited onto a background; the EXIF orientation (1-8, tag 0x0112) is read here and
applied as :data:`DISPLAY_TRANSPOSE` says.
"""

from __future__ import annotations

import logging

import numpy as np
from PIL import Image

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
_HIGH_DEPTH_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I", "F"}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


def orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8); 1 when absent, out of range or unreadable."""
    try:
        value = image.getexif().get(0x0112, 1)
    except Exception:  # a malformed EXIF block must not lose an otherwise good photo
        log.debug("unreadable EXIF ignored", exc_info=True)
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit single-channel modes -> "L" (or "LA" with a tRNS key), rescaled.

    Pillow's own ``convert("L")`` clips these (every value above 255 turns white). Here
    integer modes are read as 16-bit (0-65535) and divided by 257 with rounding, so 65535 -> 255
    and 32768 -> 128; float ("F") images are read as 0.0-1.0.
    """
    pixels = np.asarray(image)  # (H, W) uint16 / int32 / float32
    if image.mode == "F":
        scaled = np.clip(np.nan_to_num(pixels, nan=0.0), 0.0, 1.0) * 255.0
    else:
        scaled = np.clip(pixels, 0, 65535).astype(np.float32) / 257.0
    gray = Image.fromarray(np.rint(scaled).astype(np.uint8))
    key = image.info.get("transparency")
    if isinstance(key, int) and image.mode != "F":
        alpha = Image.fromarray(np.where(pixels == key, 0, 255).astype(np.uint8))
        return Image.merge("LA", (gray, alpha))
    return gray


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in _ALPHA_MODES or (image.mode in ("P", "L", "RGB") and "transparency" in image.info)


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
