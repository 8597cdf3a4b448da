"""The PNG encoding of ``render=png`` pictures (service/imaging/render.py)."""

from __future__ import annotations

import io

from PIL import Image

from service.imaging.render import png_bytes


def test_png_bytes_are_a_png() -> None:
    data = png_bytes(Image.new("RGB", (5, 4)))
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(data)).size == (5, 4)
