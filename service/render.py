"""Drawing detections on the image, for ``POST /v1/models/{name}/detect?render=png`` (Pillow only).

The picture is the image as the client displays it (EXIF orientation applied, full size), in
the colour mode the model reads, with each detection's box outlined and its label and score
written in a filled tag at the box's top-left corner (above the box where there is room).
Lower scores are drawn first, so the best detection is on top where boxes overlap.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw, ImageFont

# Distinct colours (Tableau 10), one per class id, cycling.
PALETTE = [
    (78, 121, 167),
    (242, 142, 43),
    (225, 87, 89),
    (118, 183, 178),
    (89, 161, 79),
    (237, 201, 72),
    (176, 122, 161),
    (255, 157, 167),
    (156, 117, 95),
    (186, 176, 172),
]


def line_width(width: int, height: int) -> int:
    """Outline width in pixels: 1 px per 256 px of the image's longer side, at least 1."""
    return max(1, round(max(width, height) / 256))


def font_size(width: int, height: int) -> int:
    """Label text size in pixels: 10 px, larger for images over 400 px."""
    return max(10, round(max(width, height) / 40))


def draw_detections(image: Image.Image, detections: Sequence[dict[str, Any]], size: tuple[int, int]) -> Image.Image:
    """Draw ``detections`` on ``image`` shown at ``size``.

    Args:
        image: the decoded image (EXIF orientation applied), any mode; resized to ``size``
            when it was decoded smaller (a JPEG in draft mode).
        detections: :func:`service.postprocess.detect`'s list, boxes in pixels of ``size``.
        size: (width, height) of the displayed image, in pixels.

    Returns:
        A new RGB image of ``size``.
    """
    canvas = displayed_canvas(image, size)
    width, height = canvas.size
    stroke = line_width(width, height)
    font = ImageFont.load_default(size=font_size(width, height))
    draw = ImageDraw.Draw(canvas)
    for det in sorted(detections, key=lambda d: d["score"]):
        colour = PALETTE[det["class_id"] % len(PALETTE)]
        box = det["box"]
        x0, y0 = round(box["xmin"]), round(box["ymin"])
        x1, y1 = max(x0, round(box["xmax"]) - 1), max(y0, round(box["ymax"]) - 1)  # edges -> last pixel
        draw.rectangle((x0, y0, x1, y1), outline=colour, width=stroke)
        text = f"{det['label']} {det['score']:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tag_w, tag_h = right - left + 2, bottom - top + 2
        tag_y = y0 - tag_h if y0 - tag_h >= 0 else y0  # above the box, else inside it
        draw.rectangle((x0, tag_y, x0 + tag_w - 1, tag_y + tag_h - 1), fill=colour)
        draw.text((x0 + 1 - left, tag_y + 1 - top), text, fill=(0, 0, 0), font=font)
    return canvas


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
