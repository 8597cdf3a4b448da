"""Pre-scanning a TIFF (TIFF 6.0, Section 2; BigTIFF) before Pillow opens it: structure bombs refused.

A TIFF is not bounded by its format: one IFD entry may hold 2^32 values, and Pillow turns what
it reads into Python objects, one tile per strip of an uncompressed image, one object per value
of the tags it decodes (a ``Fraction`` per rational). What it reads on open and for the
orientation: the first IFD, and the EXIF, GPS and interoperability IFDs it points to, once per
reference. A fresh user's and a reviewer's files, each of at most 20 MiB, that this walk refuses:

* 1.8 million one-byte strips of an uncompressed 1x1,800,000 image: 6.9 s and +630 MiB;
* 65,000 entries in one IFD, or 60,000 each claiming 2^30 values: 0.2-0.5 s, a warning each;
* 2 million rationals in XResolution, XMP or an EXIF tag: 4-5 s and +425 MiB;
* the EXIF, GPS and interoperability pointers all naming one IFD: 14-20 s and up to +1.4 GiB;
* the EXIF pointer as a SHORT with junk beside it, as a count-2 LONG or as a LONG8, which Pillow
  reads by its type and first value, or the headers ``II\\0*`` and ``MM*\\0`` Pillow also accepts
  (a big-endian BigTIFF, which Pillow reads as a classic TIFF, is a 415).

A JPEG-compressed TIFF's strips or tiles are walked as JPEG streams (:mod:`service.imaging.prescan_jpeg`):
a 215 KB 36-megapixel strip of 60 progressive scans cost 1.0 s of libjpeg's CPU and decoded, where
the same stream as a JPEG file is refused at 28 scans; its scans and scan pixels, summed over the
strips, now have a JPEG file's limits. libtiff's own scan cap stays set to the same limit
(``LIBTIFF_JPEG_MAX_ALLOWED_SCAN_NUMBER``). Uncompressed strips whose offsets overlap or outnumber
the rows (Pillow's own raw decoder reads them in Python) are libtiff's to read
(``service.imaging.images`` sets ``READ_LIBTIFF``).
"""

from __future__ import annotations

import struct
from collections import Counter

from service.core.errors import InvalidImage, PayloadTooLarge
from service.imaging.prescan_jpeg import JPEG_SOI, scan_jpeg
from service.imaging.prescan_limits import PrescanLimits, metadata_too_large

# Pillow's TiffImagePlugin.PREFIXES: it opens all of these; data[2] == 43 is a BigTIFF to it.
TIFF_SIGNATURES = (b"MM\x00\x2a", b"II\x2a\x00", b"MM\x2a\x00", b"II\x00\x2a", b"MM\x00\x2b", b"II\x2b\x00")
# Field types (TIFF 6.0 Section 2; BigTIFF's 16-18): struct format of one value.
_FORMATS = {
    1: "B", 2: "c", 3: "H", 4: "I", 5: "II", 6: "b", 7: "c", 8: "h", 9: "i", 10: "ii", 11: "f", 12: "d", 13: "I",
    16: "Q", 17: "q", 18: "Q",
}  # fmt: skip
_SIZES = {kind: struct.calcsize("<" + fmt) for kind, fmt in _FORMATS.items()}
_BYTES = frozenset({1, 2, 7})  # BYTE, ASCII, UNDEFINED: kept as bytes, never numbers
_RATIONALS = frozenset({5, 10})  # a Fraction each in Pillow: ~16 times an int's cost
_STRIP_TAGS = frozenset({273, 279, 324, 325})  # StripOffsets, StripByteCounts, TileOffsets, TileByteCounts
_INTEGERS = frozenset({1, 3, 4, 6, 8, 9, 13, 16, 17, 18})  # the types libtiff reads strip offsets from
_COMPRESSION, _JPEG = 259, 7  # TIFF Technical Note 2's JPEG compression ("new-style"; old-style 6 is sequential only)
_EXIF, _GPS, _INTEROP = 34665, 34853, 40965


class _Walk:
    """One TIFF's IFDs walked as Pillow reads them, with the running totals the limits bound."""

    def __init__(self, data: bytes, limits: PrescanLimits) -> None:
        self.data, self.limits, self.n = data, limits, len(data)
        self.order = "<" if data[:2] == b"II" else ">"
        self.big = data[2] == 43  # Pillow's own test
        self.pointer = "Q" if self.big else "I"
        self.count, self.entry = ("Q", "HHQ") if self.big else ("H", "HHI")
        self.entry_size, self.inline = (20, 8) if self.big else (12, 4)
        self.walked: set[int] = set()
        self.metadata = self.values = 0

    def first_value(self, kind: int, count: int, position: int) -> int | None:
        """An entry's first value as Pillow reads it (by its type; out of line when larger than the field)."""
        fmt = _FORMATS.get(kind)
        if fmt is None or count < 1 or kind in _BYTES or kind in _RATIONALS or kind in (11, 12):
            return None
        field = position + (12 if self.big else 8)
        at = field
        if count * _SIZES[kind] > self.inline:
            (at,) = struct.unpack_from(self.order + self.pointer, self.data, field)
        if at + _SIZES[kind] > self.n:
            return None
        return int(struct.unpack_from(self.order + fmt, self.data, at)[0])

    def numbers(self, kind: int, count: int, position: int) -> tuple[int, ...]:
        """An integer entry's values (strip offsets, byte counts); none when they are not in the file."""
        if kind not in _INTEGERS or count < 1:
            return ()
        at = position + (12 if self.big else 8)
        if count * _SIZES[kind] > self.inline:
            (at,) = struct.unpack_from(self.order + self.pointer, self.data, at)
        if at + count * _SIZES[kind] > self.n:
            return ()
        return struct.unpack_from(f"{self.order}{count}{_FORMATS[kind]}", self.data, at)

    def ifd(self, offset: int, what: str) -> dict[int, tuple[int, int, int]]:
        """Walk the IFD at ``offset``: {tag: (type, count, entry position)}, the first of each tag."""
        header = struct.calcsize(self.order + self.count)
        if offset < 8 or offset + header > self.n:
            return {}  # in the file's header or outside the file: none, or corrupt (Pillow says so)
        if offset in self.walked:
            raise PayloadTooLarge(
                f"the TIFF image's {what} IFD is one it has already pointed to; Pillow would decode it again "
                "for each reference: a parser bomb?"
            )
        self.walked.add(offset)
        (entries,) = struct.unpack_from(self.order + self.count, self.data, offset)
        if entries > self.limits.max_tiff_tags:
            raise PayloadTooLarge(
                f"the TIFF image has an IFD of {entries} entries, more than {self.limits.max_tiff_tags} "
                "(PATCHSERVE_MAX_TIFF_TAGS); encoders write about 10-60: a parser bomb?"
            )
        found: dict[int, tuple[int, int, int]] = {}
        position = offset + header
        for _ in range(min(entries, (self.n - position) // self.entry_size)):
            tag, kind, count = struct.unpack_from(self.order + self.entry, self.data, position)
            found.setdefault(tag, (kind, count, position))
            position += self.entry_size
            if what == "first" and tag in _STRIP_TAGS:
                if count > self.limits.max_tiff_strips:
                    raise PayloadTooLarge(
                        f"the TIFF image has {count} strips or tiles, more than {self.limits.max_tiff_strips} "
                        "(PATCHSERVE_MAX_TIFF_STRIPS); libtiff writes one per 8 KiB: a parser bomb?"
                    )
                continue
            self._count_values(kind, count, position - self.entry_size)
        return found

    def _count_values(self, kind: int, count: int, position: int) -> None:
        size = count * _SIZES.get(kind, 0)
        if size <= self.inline:
            return
        (at,) = struct.unpack_from(self.order + self.pointer, self.data, position + (12 if self.big else 8))
        held = min(size, max(self.n - at, 0))  # what the file holds: Pillow skips a tag it cannot read
        self.metadata += held
        if self.metadata > self.limits.max_metadata_bytes:
            raise metadata_too_large("TIFF", f"at least {self.metadata}", self.limits.max_metadata_bytes)
        if kind not in _BYTES:
            self.values += held // _SIZES[kind] * (16 if kind in _RATIONALS else 1)
            if self.values > self.limits.max_tiff_values:
                raise PayloadTooLarge(
                    f"the TIFF image's tags hold more than {self.limits.max_tiff_values} numbers "
                    "(PATCHSERVE_MAX_TIFF_VALUES, a rational counting 16); Pillow makes a Python object of "
                    "each: a parser bomb?"
                )

    def pointed(self, entries: dict[int, tuple[int, int, int]], tag: int, what: str) -> dict[int, tuple[int, int, int]]:
        """The IFD that ``tag`` of ``entries`` points to, walked (empty when there is none)."""
        if tag not in entries:
            return {}
        offset = self.first_value(*entries[tag])
        return {} if offset is None else self.ifd(offset, what)


def _frame_pixels(walk: _Walk, entries: dict[int, tuple[int, int, int]], tiles: bool) -> int | None:
    """The pixels one strip (ImageWidth x RowsPerStrip, at most ImageLength) or tile holds; None if unknown."""

    def tag(number: int) -> int | None:
        return walk.first_value(*entries[number]) if number in entries else None

    if tiles:
        width, length = tag(322), tag(323)  # TileWidth, TileLength
        return width * length if width is not None and length is not None else None
    width, length, rows = tag(256), tag(257), tag(278)  # ImageWidth, ImageLength, RowsPerStrip
    if width is None or length is None:
        return None
    return width * min(length, rows if rows is not None and rows > 0 else length)


_TILE_ALLOWANCE = 1 << 20  # pixels a tile may hold beyond its image's: libtiff's 256x256 default on a small image


def _check_tile_size(walk: _Walk, entries: dict[int, tuple[int, int, int]]) -> None:
    """Refuse a tile far larger than its image: Pillow's libtiff decoder allocates the whole tile.

    A 154-byte 16x16 TIFF declaring 16384x16384 tiles took +771 MiB (a third reviewer's find),
    while the image's pixel count, all that the pixel limit and budget see, was 256. A tile may
    hold the image's pixels or 1,048,576 (libtiff writes 256x256 tiles even for a tiny image),
    whichever is more.
    """
    if 322 not in entries or 323 not in entries:
        return
    values = [walk.first_value(*entries[tag]) if tag in entries else None for tag in (322, 323, 256, 257)]
    tile_width, tile_length, width, length = (v if v is not None and v > 0 else 0 for v in values)
    tile = tile_width * tile_length
    if tile > max(width * length, _TILE_ALLOWANCE):
        raise PayloadTooLarge(
            f"the TIFF image's {tile_width}x{tile_length} tiles are far larger than the {width}x{length} image "
            "(libtiff allocates a whole tile to decode it): a decoding bomb?"
        )


def _scan_jpeg_strips(walk: _Walk, entries: dict[int, tuple[int, int, int]]) -> None:
    """A JPEG-compressed TIFF's strips and tiles walked as JPEG streams, their decoding work summed.

    libtiff decodes every strip of the page with libjpeg, scan by scan over the strip, so a
    progressive strip's cost is scans x pixels as in a JPEG file, and the image's is the sum over
    its strips (a strip that several offsets name is decoded once for each). A strip's JPEG frame
    may not declare more pixels than the strip or tile holds: libtiff only warns about a taller
    last strip, and libjpeg allocates the whole frame (a 267-byte file declaring 6000x65500 in a
    16-row strip took +753 MiB). Strips and tiles are both walked (libtiff keeps whichever tag
    comes last); a byte count of 0, or none, runs to the end of the file, as libtiff estimates it.
    The walk reads each distinct strip once; strips whose bytes overlap (no encoder writes them)
    are refused, which bounds the walk by the file's size.
    """
    if _COMPRESSION not in entries or walk.first_value(*entries[_COMPRESSION]) != _JPEG:
        return
    spent = walked = 0
    for offsets_tag, counts_tag in ((273, 279), (324, 325)):
        if offsets_tag not in entries:
            continue
        offsets = walk.numbers(*entries[offsets_tag])
        counts = walk.numbers(*entries[counts_tag]) if counts_tag in entries else ()
        frame = _frame_pixels(walk, entries, tiles=offsets_tag == 324)
        regions = Counter((offset, counts[i] if i < len(counts) else 0) for i, offset in enumerate(offsets))
        for (offset, count), references in regions.items():
            end = min(offset + count, walk.n) if count > 0 else walk.n
            if offset < 0 or offset >= end or not walk.data.startswith(JPEG_SOI, offset):
                continue  # not a JPEG stream: libjpeg refuses it
            walked += end - offset
            if walked > walk.n:
                raise PayloadTooLarge(
                    "the TIFF image's JPEG strips or tiles overlap (they name more bytes than the file holds); "
                    "encoders never write that: a decoding bomb?"
                )
            work = scan_jpeg(
                walk.data, walk.limits, start=offset, end=end, spent=spent, what="TIFF image's JPEG strip", frame=frame
            )
            spent += work.work * references
            if spent > walk.limits.max_jpeg_scan_pixels:
                raise PayloadTooLarge(
                    f"the TIFF image's JPEG strips take {spent} scan pixels to decode, more than the limit of "
                    f"{walk.limits.max_jpeg_scan_pixels} (PATCHSERVE_MAX_JPEG_SCAN_PIXELS)"
                )


def scan_tiff(data: bytes, limits: PrescanLimits) -> None:
    """Walk what Pillow reads of a TIFF and refuse a structure bomb (module docstring).

    The first IFD (the page decoded; later pages and SubIFDs are never read), then the EXIF and GPS
    IFDs it points to and the interoperability IFD the EXIF IFD points to, each pointer read as
    Pillow reads it. Stops at the end of the data or an offset outside it (corrupt: Pillow says
    so), or at the first limit exceeded.

    Raises:
        InvalidImage: a big-endian BigTIFF, which Pillow misreads (415).
        PayloadTooLarge: an IFD of more entries than ``limits.max_tiff_tags``; more strips or tiles
            than ``limits.max_tiff_strips``; JPEG strips or tiles of more scans, or more scan pixels
            in all, than a JPEG file may hold (:func:`~service.imaging.prescan_jpeg.scan_jpeg`), or
            overlapping; out-of-entry values of more bytes than
            ``limits.max_metadata_bytes`` or more numbers than ``limits.max_tiff_values``; an IFD
            pointed to twice (413).
    """
    if data.startswith(b"MM\x00\x2b"):
        # Pillow takes it for a classic TIFF (it tests byte 2 for 43) and reads nonsense.
        raise InvalidImage("big-endian BigTIFF files are not decoded here; send a classic TIFF or another format")
    walk = _Walk(data, limits)
    if len(data) < (16 if walk.big else 8):
        return
    (first,) = struct.unpack_from(walk.order + walk.pointer, data, 8 if walk.big else 4)
    entries = walk.ifd(first, "first")
    _check_tile_size(walk, entries)
    _scan_jpeg_strips(walk, entries)
    exif = walk.pointed(entries, _EXIF, "EXIF")
    walk.pointed(entries, _GPS, "GPS")
    walk.pointed(exif, _INTEROP, "interoperability")
