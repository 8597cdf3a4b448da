"""What a JPEG, PNG, GIF, TIFF or BMP may hold before it is refused (413), and the refusal's words.

Shared by :mod:`service.imaging.prescan` and the scanners it calls (``prescan_jpeg``, ``prescan_tiff``,
``prescan_bmp``); the limits are settings of the same names (``PATCHSERVE_MAX_...``,
``service.http.app.decode_limits``).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.errors import PayloadTooLarge


@dataclass(frozen=True)
class PrescanLimits:
    """What one JPEG, PNG, GIF, TIFF or BMP may hold before it is refused (413), checked before decoding.

    Attributes:
        max_jpeg_scans: SOS markers (scans) in a JPEG; libjpeg's progressive default is 10.
        max_jpeg_scan_pixels: scans x width x height of a JPEG of two or more scans, the work
            of decoding it (a progressive JPEG is decoded scan by scan over the whole image):
            1e9 lets a 40-megapixel photo have 25 scans. A single scan's size is the image
            pixel limit's (``PATCHSERVE_MAX_IMAGE_PIXELS``) to refuse, in its own words.
        max_jpeg_segments: marker segments of a JPEG, header and between scans.
        max_jpeg_fill_bytes: bytes between a JPEG's segments that are not part of a marker
            (0xFF fill, T.81 B.1.1.2, and junk Pillow skips one byte at a time).
        max_png_chunks: chunks of a PNG, IDAT included.
        max_gif_blocks: extension blocks and their data sub-blocks before a GIF's first image
            (a 2 MB ICC profile in 255-byte sub-blocks is 8,000).
        max_tiff_strips: strips or tiles of a TIFF (the count of StripOffsets, TileOffsets or
            their byte counts in the first IFD); Pillow makes one Python tile per strip.
        max_tiff_tags: entries of one TIFF IFD (the first, and its EXIF, GPS and
            interoperability IFDs, which Pillow reads).
        max_tiff_values: numbers in a TIFF's tag values outside their entries, which Pillow
            turns into Python objects: 1 per value, 16 per (signed) rational (its Fraction).
        max_bmp_rle_pixels: pixels of a run-length-encoded BMP (RLE8, RLE4), which Pillow decodes
            in Python (about 0.3 us an opcode, 70-90 ns a padded pixel).
        max_metadata_bytes: bytes of metadata (JPEG APPn and COM segments; PNG chunks other than
            IDAT and fdAT; TIFF tag values stored outside their IFD entry, other than the strip
            and tile arrays; an ICC profile or text after decompression), per image.
    """

    max_jpeg_scans: int = 64
    max_jpeg_scan_pixels: int = 1_000_000_000
    max_jpeg_segments: int = 1024
    max_jpeg_fill_bytes: int = 65536
    max_png_chunks: int = 10_000
    max_gif_blocks: int = 20_000
    max_tiff_strips: int = 16_384
    max_tiff_tags: int = 1024
    max_tiff_values: int = 1 << 20
    max_bmp_rle_pixels: int = 1 << 20
    max_metadata_bytes: int = 16 * 1024 * 1024


def metadata_too_large(fmt: str, size: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the {fmt} image's metadata is {size} bytes; the limit is {limit} (PATCHSERVE_MAX_IMAGE_METADATA_BYTES)"
    )
