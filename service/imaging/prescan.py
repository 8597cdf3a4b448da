"""Pre-scanning JPEG, PNG, GIF, TIFF, BMP, ICO and AVIF files, in bytes, before Pillow opens them: bombs refused.

Pillow parses a JPEG's header segments and a PNG's chunks in pure Python, one Python object (or
several) per segment, chunk or fill byte, and libjpeg decodes each progressive scan over the
whole image. A small file can therefore cost seconds of CPU and hundreds of MiB (issue 15 B, C):

* a JPEG with 5.2 million empty APP0 segments (20.8 MB): 8.2 s and +707 MiB in Pillow's header
  parser; one with 20 million 0xFF fill bytes (ITU T.81, B.1.1.2 allows any number before a
  marker): 11.5 s;
* a flat 6000x6000 progressive JPEG whose last refinement scan is repeated 500 times (170 KB):
  about 10 s in libjpeg, a cost of scans x pixels;
* a PNG with 1.7 million empty private chunks: 5.5 s, +225 MiB;
* a GIF with 5 million one-byte comment sub-blocks before its image (10 MB): 3.2 s;
* an uncompressed 1x1,800,000 grey TIFF with one row per strip (16 MB, 1.8 million strip
  offsets): 6.9 s and +630 MiB, one Python tile per strip; a TIFF of 65,000 tags, or of 60,000
  tags each claiming 2^30 values, 0.2-0.5 s and one logged warning per tag.

:func:`prescan` walks the same structure at C speed (``bytes.find``, ``re`` and
``struct.unpack_from`` on the buffer; no copy, one small object per marker or chunk) and stops
at the first limit exceeded, so the walk itself is bounded by the limits, not by the file. A
file that breaks the structure in a way these limits do not cover is left to Pillow, which
reports it as truncated or corrupt. A TIFF is not bounded by its format: one IFD entry may hold
2^32 values (TIFF 6.0, Section 2), and Pillow reads the strip and tile offsets into Python objects
(:mod:`service.imaging.prescan_tiff`). A BMP's run-length encoding is decoded in Python, and an
ICO's image is decoded while it is opened (:mod:`service.imaging.prescan_bmp`). An AVIF's AV1 frame
may be larger than the size Pillow reads (:mod:`service.imaging.prescan_avif`). Other formats pass
through: their parsers are C (libwebp, an uncompressed BMP's).

The limits (:class:`PrescanLimits`) are far above what real cameras and encoders write: libjpeg
and libjpeg-turbo write 10 scans for a colour progressive JPEG (6 for grey), mozjpeg's searched
scripts about 10-20; a camera's header is about 10-20 segments (APP0/APP1 EXIF/XMP/APP2 ICC/
APP13, DQT, SOF, DHT, DRI), extended XMP and a 16 MB ICC profile at most a few hundred more
(64 KB each); encoders write no fill bytes; a PNG of 20 MiB in libpng's 8 KiB IDAT chunks is
2,560 chunks; libtiff's 8 KiB strips of a 20 MiB TIFF are 2,560 strips, and a TIFF IFD holds
about 10-60 tags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from service.core.errors import PayloadTooLarge
from service.imaging.prescan_avif import is_avif, scan_avif
from service.imaging.prescan_bmp import BMP_SIGNATURE, ICO_SIGNATURE, scan_bmp, scan_ico
from service.imaging.prescan_jpeg import JPEG_SOI, JpegWalk, scan_jpeg
from service.imaging.prescan_limits import PrescanLimits, metadata_too_large
from service.imaging.prescan_png import PNG_SIGNATURE, scan_png
from service.imaging.prescan_tiff import TIFF_SIGNATURES, scan_tiff

GIF_SIGNATURES = (b"GIF87a", b"GIF89a")


def scan_gif(data: bytes, limits: PrescanLimits) -> None:
    """Walk a GIF's blocks up to its first image (GIF89a spec, sections 15-24) and refuse a parser bomb.

    Pillow reads the extension blocks before the first image, and each of their data
    sub-blocks, in Python (5 million one-byte comment sub-blocks, 10 MB: 3.2 s); the image's own
    LZW sub-blocks are read by its C decoder. Stops at the first image descriptor, the trailer,
    anything else (corrupt: Pillow says so), or the first limit exceeded.

    Raises:
        PayloadTooLarge: more blocks than ``limits.max_gif_blocks``, or more extension data than
            ``limits.max_metadata_bytes`` (413).
    """
    n = len(data)
    if n < 13:
        return
    flags = data[10]  # the logical screen descriptor's packed fields (section 18)
    pos = 13 + (3 * (2 << (flags & 0x07)) if flags & 0x80 else 0)  # and the global colour table
    blocks, metadata = 0, 0
    while pos + 1 < n and data[pos] == 0x21:  # an extension: introducer, label, data sub-blocks
        pos += 2
        while pos < n:
            size = data[pos]
            pos += 1 + size
            blocks += 1
            metadata += size
            if blocks > limits.max_gif_blocks:
                raise PayloadTooLarge(
                    f"the GIF image has more than {limits.max_gif_blocks} extension blocks before its first image "
                    "(PATCHSERVE_MAX_GIF_BLOCKS): a parser bomb?"
                )
            if metadata > limits.max_metadata_bytes:
                raise metadata_too_large("GIF", f"over {limits.max_metadata_bytes}", limits.max_metadata_bytes)
            if size == 0:  # the block terminator
                break


# Each container the pre-scan walks: its leading bytes and its scanner (a new one is one row here).
SCANNERS: tuple[tuple[tuple[bytes, ...], Callable[[bytes, PrescanLimits], object]], ...] = (
    ((JPEG_SOI,), scan_jpeg),
    ((PNG_SIGNATURE,), scan_png),
    (GIF_SIGNATURES, scan_gif),
    (TIFF_SIGNATURES, scan_tiff),
    ((BMP_SIGNATURE,), scan_bmp),
    ((ICO_SIGNATURE,), scan_ico),
)


class Prescanned(NamedTuple):
    """What decoding needs to know from the pre-scan: a JPEG of several scans (progressive, or a
    scan per component: libjpeg then holds the whole image's coefficients, whatever size it is
    decoded to), and a lossless JPEG (which libjpeg cannot decode scaled)."""

    multi_scan: bool = False
    lossless: bool = False


def prescan(data: bytes, limits: PrescanLimits) -> Prescanned:
    """Refuse a JPEG, PNG, GIF, TIFF, BMP or ICO whose structure would cost Pillow far more than its size suggests.

    The scanner of :data:`SCANNERS` whose signature ``data`` starts with walks it; any other data
    passes unchecked (Pillow identifies it).

    Returns:
        :class:`Prescanned`: what a JPEG's walk found; the defaults for any other format.

    Raises:
        PayloadTooLarge: a limit of ``limits`` exceeded (413); see :func:`scan_jpeg`, :func:`scan_png`,
            :func:`scan_gif`, :func:`scan_tiff`, :func:`scan_bmp`, :func:`scan_ico`.
        InvalidImage: a structure Pillow would misread (415): an indexed PNG without a palette,
            a big-endian BigTIFF.
    """
    if is_avif(data):  # its signature is not at the start: a box size comes first
        scan_avif(data, limits)
        return Prescanned()
    for signatures, scan in SCANNERS:
        if data.startswith(signatures):
            found = scan(data, limits)
            if isinstance(found, JpegWalk):
                return Prescanned(multi_scan=found.work > 0, lossless=found.lossless)
            return Prescanned()
    return Prescanned()
