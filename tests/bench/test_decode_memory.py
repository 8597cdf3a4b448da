"""bench.decode_memory: the files it measures are what their names say."""

from __future__ import annotations

import io
import struct

import pytest
from PIL import Image

from bench.decode_memory import KINDS, image_file


@pytest.mark.parametrize("kind", [k for k in KINDS if "PNG" in k])
def test_each_png_kind_has_the_bit_depth_and_colour_type_it_names(kind: str) -> None:
    data = image_file(kind, side=16)
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])  # IHDR (PNG, Sec. 11.2.2)
    assert (width, height) == (16, 16)
    assert depth == (16 if kind.startswith("16-bit") else 8)
    assert colour == {"grey": 0, "RGB": 2, "RGBA": 6}[kind.split()[1]]
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # the chunks and their CRCs are valid
        assert image.size == (16, 16)
