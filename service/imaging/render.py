"""Pictures for ``render=png``, shared by the tasks: the displayed canvas and PNG encoding (Pillow only)."""

from __future__ import annotations

import io

from PIL import Image


def displayed_canvas(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image`` in RGB at ``size`` (width, height): the displayed size, when it was decoded smaller."""
    canvas = image.convert("RGB")
    if canvas.size != tuple(size):
        canvas = canvas.resize(size, Image.Resampling.BILINEAR)
    return canvas


def png_bytes(image: Image.Image) -> bytes:
    """The image as PNG file bytes (zlib level 3: fast, still compact)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=3)
    return buffer.getvalue()
