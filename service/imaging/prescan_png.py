"""Pre-scanning a PNG (PNG spec, 5.3: length, type, data, CRC) before Pillow opens it: chunk bombs refused.

A PNG file, or one embedded in an ICO (:mod:`service.imaging.prescan_bmp`). The costs it bounds
are in :mod:`service.imaging.prescan`'s docstring.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from service.core.errors import InvalidImage, PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits, metadata_too_large

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG chunks that carry pixels (PNG spec, 11.2.4 IDAT; APNG's fdAT); every other chunk's data
# counts as metadata.
_IMAGE_DATA = frozenset({b"IDAT", b"fdAT"})


class PngWalk(NamedTuple):
    """What :func:`scan_png` found: the largest size any IHDR declares ((0, 0): none), and the
    chunks walked, counting ``chunks`` of earlier walks."""

    width: int
    height: int
    chunks: int


def scan_png(data: bytes, limits: PrescanLimits, *, start: int = 0, chunks: int = 0, what: str = "PNG") -> PngWalk:
    """Walk a PNG's chunks and refuse a structure bomb.

    Stops at IEND, at the end of the data, or at the first limit exceeded. CRCs are Pillow's
    to check. Every IHDR counts (Pillow keeps the last one, wherever it is).

    Args:
        data: the file, or a buffer holding the PNG from ``start`` (an ICO's image), which starts
            with the PNG signature.
        limits: the limits to apply.
        start: where the PNG starts in ``data``.
        chunks: chunks already walked in the same file (an ICO's other images), counted against
            ``limits.max_png_chunks`` with this PNG's.
        what: the image as the messages name it ("PNG"; "ICO image's PNG" inside an icon).

    Raises:
        InvalidImage: an IHDR whose compression, filter or interlace method the spec does not
            define; an indexed-colour PNG (its last IHDR before the image data says so) with
            no PLTE chunk before its image data; a second iCCP chunk, or one after the image data
            (Pillow inflated each: 100 of them in 1.6 MB took 3.2 s) (415).
        PayloadTooLarge: more chunks than ``limits.max_png_chunks``, or more metadata (bytes of
            chunks other than IDAT and fdAT) than ``limits.max_metadata_bytes`` (413).
    """
    pos, metadata, n = start + len(PNG_SIGNATURE), 0, len(data)
    width = height = 0
    indexed = has_palette = profiles = image_data = False
    while pos + 8 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if not kind.isalpha():  # PNG spec 5.4: a chunk type is four ASCII letters; corrupt, Pillow says so
            break
        if kind == b"IHDR" and pos + 21 <= n:
            w, h = struct.unpack_from(">II", data, pos + 8)
            width, height = max(width, w), max(height, h)
            indexed = data[pos + 17] == 3  # colour type 3: indexed
            if data[pos + 18] or data[pos + 19] or data[pos + 20] > 1:  # PNG spec 11.2.2: 0, 0, and 0 or 1
                raise InvalidImage(
                    f"the {what} image is corrupt: its IHDR's compression, filter or interlace method is not "
                    "one the PNG spec defines (11.2.2)"
                )
        elif kind == b"PLTE":
            has_palette = True
        elif kind == b"iCCP":  # Pillow inflates each one, up to the metadata limit, outside its text budget
            if profiles or image_data:
                raise InvalidImage(
                    f"the {what} image is corrupt: a second iCCP chunk, or one after the image data (PNG spec, "
                    "11.3.3.3: at most one, before PLTE and IDAT)"
                )
            profiles = True
        elif kind in _IMAGE_DATA:
            image_data = True
            if indexed and not has_palette:  # Pillow would decode the indices as grey levels
                raise InvalidImage(
                    f"the {what} image is corrupt: an indexed-colour image without a PLTE chunk (PNG spec, 11.2.3)"
                )
        chunks += 1
        if chunks > limits.max_png_chunks:
            raise PayloadTooLarge(
                f"the {what} image has more than {limits.max_png_chunks} chunks (PATCHSERVE_MAX_PNG_CHUNKS); "
                "encoders write one per 8-64 KiB of image data: a parser bomb?"
            )
        if kind not in _IMAGE_DATA:
            metadata += min(length, n - pos - 12)  # what the file holds, not what a corrupt length says
            if metadata > limits.max_metadata_bytes:
                raise metadata_too_large(what, f"at least {metadata}", limits.max_metadata_bytes)
        if kind == b"IEND":
            break
        pos += 12 + length
    return PngWalk(width, height, chunks)
