"""Pre-scanning a JPEG stream (ITU T.81, Annex B) before libjpeg decodes it: structure bombs refused.

A whole JPEG file, or one strip or tile of a JPEG-compressed TIFF (:mod:`service.imaging.prescan_tiff`),
whose decoding work, scans x pixels, is budgeted across all of its strips. The costs it bounds are
in :mod:`service.imaging.prescan`'s docstring.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

from service.core.errors import PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits, metadata_too_large

JPEG_SOI = b"\xff\xd8"

# T.81 Table B.1: SOF0-3, 5-7, 9-11, 13-15 (not DHT C4, JPG C8, DAC CC); progressive: 2, 6, 10, 14.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, 0xD8, 0xD9, *range(0xD0, 0xD8)})  # TEM, SOI, EOI, RST0-7: no length
_SOS, _EOI = 0xDA, 0xD9
_LOSSLESS = frozenset({0xC3, 0xC7, 0xCB, 0xCF})  # T.81 Annex H: lossless, which libjpeg cannot scale


class JpegWalk(NamedTuple):
    """What :func:`scan_jpeg` found: its decoding work in scan pixels (scans x width x height for two
    or more scans, from what was walked: a truncated stream counts the scans it holds; 0 for one),
    and whether its frame is lossless (T.81 Annex H: DCT scaling, the draft mode, does not apply)."""

    work: int
    lossless: bool


# A marker inside or after entropy-coded data (T.81, B.1.1.5): 0xFF followed by anything but a
# stuffed 0x00, a restart marker or more fill.
_MARKER_IN_SCAN = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")


def _fill_exceeded(limits: PrescanLimits) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the JPEG image has more than {limits.max_jpeg_fill_bytes} fill or junk bytes between its segments "
        "(PATCHSERVE_MAX_JPEG_FILL_BYTES); no encoder writes that many: a parser bomb?"
    )


def _next_marker(data: bytes, pos: int, n: int, fill: int, limits: PrescanLimits) -> tuple[int, int]:
    """Skip junk and 0xFF fill before the marker at ``pos``: (marker position after 0xFF, fill count).

    Returns a position of ``n`` (where the stream ends) when the stream ends first.
    """
    budget = limits.max_jpeg_fill_bytes - fill
    ff = data.find(b"\xff", pos, min(n, pos + budget + 1))
    if ff < 0:
        if n - pos > budget:
            raise _fill_exceeded(limits)
        return n, fill + n - pos
    fill += ff - pos
    end = ff + 1
    limit = min(n, end + (limits.max_jpeg_fill_bytes - fill) + 1)
    while end < limit and data[end] == 0xFF:  # bounded by the fill budget, which the next check enforces
        end += 1
    fill += end - ff - 1
    if fill > limits.max_jpeg_fill_bytes:
        raise _fill_exceeded(limits)
    return end, fill


def scan_jpeg(
    data: bytes,
    limits: PrescanLimits,
    *,
    start: int = 0,
    end: int | None = None,
    spent: int = 0,
    what: str = "JPEG image",
    frame: int | None = None,
) -> JpegWalk:
    """Walk a JPEG's marker segments (ITU T.81, Annex B) and refuse a structure bomb.

    The header up to the first scan is walked segment by segment (each length-prefixed segment
    skipped whole); after it, the markers between and after the scans are found with one
    regular expression over the entropy-coded data, up to the first EOI. The walk stops at the
    first limit exceeded.

    Args:
        data: the file, or a larger buffer holding the stream at ``data[start:end]`` (a TIFF's
            strip, read in place: no copy), starting with SOI (0xFFD8).
        limits: the limits to apply.
        start, end: where the stream lies in ``data`` (``end`` None: to its end).
        spent: scan pixels already spent by earlier streams of the same image (a TIFF's other
            strips), counted against ``limits.max_jpeg_scan_pixels`` with this stream's.
        what: the stream in the 413's words.
        frame: the most pixels its frame (SOF) may declare (a TIFF strip's or tile's); None: any.

    Returns:
        Its work and frame (:class:`JpegWalk`).

    Raises:
        PayloadTooLarge: more scans, scans x pixels (with ``spent``), segments, fill bytes or
            metadata bytes than ``limits`` allow, or a frame of more pixels than ``frame`` (413).
    """
    n = len(data) if end is None else min(end, len(data))
    pos, fill, segments, metadata, pixels, scans = start + 2, 0, 0, 0, 0, 0
    lossless = False
    while scans == 0:  # the header: every segment up to and including the first SOS
        at, fill = _next_marker(data, pos, n, fill, limits)
        if at >= n:
            return JpegWalk(0, lossless)  # truncated: Pillow says so
        marker, pos = data[at], at + 1
        if marker == 0x00:  # 0xFF00 outside a scan: junk that Pillow skips
            fill += 2
            if fill > limits.max_jpeg_fill_bytes:
                raise _fill_exceeded(limits)
            continue
        segments += 1
        if segments > limits.max_jpeg_segments:
            break
        if marker in _STANDALONE:
            if marker == _EOI:
                return JpegWalk(0, lossless)
            continue
        if pos + 2 > n:
            return JpegWalk(0, lossless)
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            return JpegWalk(0, lossless)  # corrupt: Pillow says so
        if marker in _SOF and pos + 7 <= n:
            height, width = struct.unpack_from(">HH", data, pos + 3)
            pixels, lossless = width * height, marker in _LOSSLESS
            if frame is not None and pixels > frame:
                raise PayloadTooLarge(
                    f"the {what} declares a {width}x{height} frame, more than the {frame} pixels it holds "
                    "(libjpeg would allocate all of them): a decoding bomb?"
                )
        elif 0xE0 <= marker <= 0xEF or marker == 0xFE:
            metadata += length - 2
        pos += length
        scans += marker == _SOS
    while segments <= limits.max_jpeg_segments:  # the scans and the segments between them
        if metadata > limits.max_metadata_bytes:
            raise metadata_too_large("JPEG", f"over {limits.max_metadata_bytes}", limits.max_metadata_bytes)
        if scans > limits.max_jpeg_scans:
            raise PayloadTooLarge(
                f"the {what} has more than {limits.max_jpeg_scans} scans (PATCHSERVE_MAX_JPEG_SCANS); encoders "
                "write about 10: a scan bomb?"
            )
        # one scan's size is the image pixel limit's to refuse (Pillow reads it from the header)
        if scans > 1 and spent + scans * pixels > limits.max_jpeg_scan_pixels:
            earlier = f" (beside {spent} scan pixels in the image's earlier strips or tiles)" if spent else ""
            raise PayloadTooLarge(
                f"the {what} has at least {scans} scans of {pixels} pixels{earlier}, more work than the limit of "
                f"{limits.max_jpeg_scan_pixels} scan pixels (PATCHSERVE_MAX_JPEG_SCAN_PIXELS)"
            )
        found = _MARKER_IN_SCAN.search(data, pos, n)
        if found is None:
            break
        marker, pos = data[found.start() + 1], found.end()
        if marker == _EOI:
            break
        segments += 1
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            break
        (length,) = struct.unpack_from(">H", data, pos)
        if 0xE0 <= marker <= 0xEF or marker == 0xFE:
            metadata += max(length - 2, 0)
        pos += max(length, 2)
        scans += marker == _SOS
    else:
        raise PayloadTooLarge(
            f"the {what} has more than {limits.max_jpeg_segments} marker segments (PATCHSERVE_MAX_JPEG_SEGMENTS); "
            "cameras write about 20: a parser bomb?"
        )
    return JpegWalk(scans * pixels if scans > 1 else 0, lossless)
