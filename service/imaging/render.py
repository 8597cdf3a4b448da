"""Pictures for ``render=png``, shared by the tasks: the displayed canvas and PNG encoding (Pillow only)."""

from __future__ import annotations

import io
import math

from PIL import Image

# The most pixels a picture is drawn with (2048 x 2048). A larger displayed image is drawn scaled
# down to this, aspect kept, so drawing and PNG-encoding cost a bounded time and memory whatever
# the upload (a 1-bit 8000x5000 PNG, drawn full size, took seconds of a core and about 2 GB); a
# picture is for looking at, the JSON keeps the full-resolution boxes.
MAX_PICTURE_PIXELS = 2048 * 2048

_RESIZED_AS_IS = frozenset({"L", "LA", "RGB", "RGBA", "RGBX"})  # modes Pillow resizes (bilinear) without a convert


def picture_size(size: tuple[int, int]) -> tuple[int, int]:
    """The (width, height) in pixels a picture of an image displayed at ``size`` is drawn at.

    ``size`` itself up to :data:`MAX_PICTURE_PIXELS`; beyond, scaled down to fit, aspect kept
    (each side at least 1).
    """
    width, height = size
    if width * height <= MAX_PICTURE_PIXELS:
        return width, height
    scale = math.sqrt(MAX_PICTURE_PIXELS / (width * height))
    w, h = max(1, int(width * scale)), max(1, int(height * scale))
    h = max(1, min(h, MAX_PICTURE_PIXELS // w))  # a side raised to 1 pixel: the other gives way, so the bound holds
    return max(1, min(w, MAX_PICTURE_PIXELS // h)), h


MIN_FONT_SIZE = 10  # pixels: the smallest caption or label text drawn


def bounded_font_size(preferred: int, width: int, height: int) -> int:
    """A text size in pixels for a picture of ``width`` x ``height`` pixels.

    ``preferred`` (what the picture's size asks for: it grows with the image), but at most a
    quarter of the picture's shorter side, and at least :data:`MIN_FONT_SIZE`. A picture holds
    at most :data:`MAX_PICTURE_PIXELS`, so its shorter side, and the font, stay bounded (512 px at
    the most) whatever the aspect ratio: a 60 x 70,000 image would otherwise ask for a 4,372 px
    font, whose glyph masks alone exceed Pillow's pixel limit, and a 1 x 4,000,000 one for a size
    FreeType refuses.
    """
    return max(MIN_FONT_SIZE, min(preferred, min(width, height) // 4))


def displayed_canvas(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image`` in RGB, at the size its picture is drawn: :func:`picture_size` of ``size`` (width, height).

    ``size`` is the displayed size (the image may have been decoded smaller, a JPEG in draft
    mode). An L, LA, RGB or RGBA image is resized before it is converted to RGB; a 1-bit one is
    made greyscale first (Pillow would resize it by nearest neighbour and lose thin lines), and
    other modes (P, CMYK, 16-bit, float) are converted to RGB at their decoded size first.
    """
    target = picture_size(size)
    if image.size == target:
        return image.convert("RGB")
    if image.mode not in _RESIZED_AS_IS:
        image = image.convert("L" if image.mode == "1" else "RGB")
    # reducing_gap: a box reduction first, then bilinear, so a 40 MP image shrinks in a fraction of a second
    return image.resize(target, Image.Resampling.BILINEAR, reducing_gap=3.0).convert("RGB")


def scale_of(canvas: Image.Image, size: tuple[int, int]) -> tuple[float, float]:
    """(x, y) factors from pixels of the displayed ``size`` to pixels of ``canvas`` (1.0 when drawn full size)."""
    return canvas.width / size[0], canvas.height / size[1]


def png_bytes(image: Image.Image) -> bytes:
    """The image as PNG file bytes (zlib level 3: fast, still compact)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=3)
    return buffer.getvalue()
