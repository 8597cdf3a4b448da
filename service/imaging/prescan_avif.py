"""Pre-scanning an AVIF still image (ISO/IEC 23008-12 HEIF items, AV1 Image File Format) before it is decoded.

Pillow reads an AVIF's size from the primary item's ``ispe`` property, and the pixel limit and the
worker's budget count that size; but libavif hands the item's AV1 bitstream to dav1d, which
decodes each frame at the size the bitstream's own sequence header gives (AV1 spec, 5.5.1:
``max_frame_width_minus_1``, ``max_frame_height_minus_1``), up to libavif's 16384x16384. A
reviewer's 1,961-byte file with a 12000x12000 frame inside a 16x16 ``ispe`` took 0.29 s and
+298 MiB while 256 pixels were reserved. This walk reads each coded item's ``ispe`` (through
``ipma``) and the sequence headers in its data (through ``iloc``), and refuses a frame larger than
its item's ``ispe``. An image sequence's tracks (``moov``/``trak``, ISO/IEC 14496-12, 8.3) are
walked too: libavif sizes the image from a track's ``tkhd`` and decodes its first sample for the
first frame, so the sequence headers in that sample and in the sample entry's ``av1C`` may not
declare a frame larger than the track's ``tkhd`` or ``av01`` sample entry (a reviewer's 16x16
track of 12000x12000 frames took +283 MiB with 256 pixels reserved). Anything it cannot follow is
left to libavif, which reports a corrupt file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from service.core.errors import PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits

_MAX_BOXES = 4096  # boxes walked in one container; an AVIF still holds a few dozen
_MAX_OBUS = 256  # OBUs walked in one item: a still image's are a handful (AV1 spec, 7.5)
_MAX_HEADERS = 4  # sequence headers in one item: a still image's is one
_MAX_SPANS = 1024  # item extents walked in one file: a grid of 32x32 tiles
_SEQUENCE_HEADER = 1  # obu_type (AV1 spec, 6.2.2)


def is_avif(data: bytes) -> bool:
    """An ISO BMFF file (``ftyp`` first) whose major brand is AVIF's, as Pillow's plugin accepts it."""
    return data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis", b"mif1", b"msf1")


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in ``data[start:end]`` (ISO/IEC 14496-12, 4.2)."""
    pos, seen = start, 0
    while pos + 8 <= end:
        if seen == _MAX_BOXES:  # what lies beyond would go unread: refused rather than skipped
            raise _too_many("boxes in one container")
        size, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if size == 1 and pos + 16 <= end:
            (size,) = struct.unpack_from(">Q", data, pos + 8)
            header = 16
        elif size == 0:
            size = end - pos
        if size < header or pos + size > end:
            return
        yield kind, pos + header, pos + size
        pos += size
        seen += 1


def _too_many(what: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"the AVIF image has more than {_MAX_BOXES} {what}; a still image holds a few dozen")


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((s, e) for k, s, e in _boxes(data, start, end) if k == kind), None)


def _uint(data: bytes, pos: int, size: int) -> int:
    return int.from_bytes(data[pos : pos + size], "big") if size else 0


def _locations(data: bytes, start: int, end: int, idat: tuple[int, int] | None) -> dict[int, list[tuple[int, int]]]:
    """``iloc`` (ISO/IEC 14496-12, 8.11.3): item ID -> its extents (offset, length) in ``data``.

    Extents in the file (construction method 0) or in the ``idat`` box (1); items built from other
    items (2) are left out.
    """
    version = data[start]
    pos = start + 4
    offset_size, length_size = data[pos] >> 4, data[pos] & 15
    base_size, index_size = data[pos + 1] >> 4, (data[pos + 1] & 15 if version in (1, 2) else 0)
    pos += 2
    width = 4 if version == 2 else 2
    count = _uint(data, pos, width)
    pos += width
    found: dict[int, list[tuple[int, int]]] = {}
    extents_left = _MAX_BOXES  # in all items: each may take no bytes (offset and length sizes of 0)
    if count > _MAX_BOXES:
        raise _too_many("items")
    for _ in range(count):
        item = _uint(data, pos, width)
        pos += width
        method = 0
        if version in (1, 2):
            method = data[pos + 1] & 15
            pos += 2
        pos += 2  # data_reference_index
        base = _uint(data, pos, base_size)
        pos += base_size
        extents = _uint(data, pos, 2)
        pos += 2
        extents_left -= extents
        if extents_left < 0:
            raise _too_many("item extents")
        spans = []
        for _ in range(extents):
            pos += index_size if version in (1, 2) else 0
            offset, length = _uint(data, pos, offset_size), _uint(data, pos + offset_size, length_size)
            pos += offset_size + length_size
            if method == 0 or (method == 1 and idat is not None):
                origin, limit = (0, len(data)) if method == 0 or idat is None else idat
                first = origin + base + offset
                spans.append((first, length if length else limit - first))  # 0: to the end of its container
        if method in (0, 1):
            found[item] = spans
        if pos > end:
            break
    return found


def _properties(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """``iprp``: AV1 item ID -> its ``ispe`` (width, height), through ``ipco`` and ``ipma`` (ISO/IEC 23008-12,
    9.3). Only items with an ``av1C`` property count: a HEIF's HEVC items share the container, not the codec."""
    ipco = _child(data, start, end, b"ipco")
    if ipco is None:
        return {}
    boxes = list(enumerate(_boxes(data, *ipco), start=1))
    spatial = {
        index: struct.unpack_from(">II", data, s + 4)
        for index, (kind, s, e) in boxes
        if kind == b"ispe" and e - s >= 12
    }
    av1 = {index for index, (kind, _, _) in boxes if kind == b"av1C"}
    found: dict[int, tuple[int, int]] = {}
    coded: set[int] = set()
    for kind, s, e in _boxes(data, start, end):
        if kind != b"ipma" or e - s < 8:
            continue
        version, large = data[s], data[s + 3] & 1
        pos = s + 4
        (count,) = struct.unpack_from(">I", data, pos)
        pos += 4
        width = 2 if version < 1 else 4
        if count > _MAX_BOXES:
            raise _too_many("property associations")
        for _ in range(count):
            if pos + width + 1 > e:
                break
            item, associations = _uint(data, pos, width), data[pos + width]
            pos += width + 1
            if pos + associations * (2 if large else 1) > e:
                break
            for _ in range(associations):
                index = _uint(data, pos, 2 if large else 1) & (0x7FFF if large else 0x7F)
                pos += 2 if large else 1
                if index in spatial:  # the first, as libavif reads it (a second, larger one hid a frame)
                    found.setdefault(item, spatial[index])
                coded.update((item,) if index in av1 else ())
    return {item: size for item, size in found.items() if item in coded}


class _Bits:
    """An MSB-first bit reader (AV1 spec, 4.10.2 f(n), 4.10.3 uvlc())."""

    def __init__(self, data: bytes, start: int, end: int) -> None:
        self.data, self.bit, self.end = data, start * 8, end * 8

    def f(self, n: int) -> int:
        if self.bit + n > self.end:
            raise EOFError
        value = 0
        for _ in range(n):
            value = value << 1 | (self.data[self.bit >> 3] >> (7 - (self.bit & 7))) & 1
            self.bit += 1
        return value

    def uvlc(self) -> int:
        zeros = 0
        while not self.f(1):
            zeros += 1
            if zeros >= 32:
                return (1 << 32) - 1
        return self.f(zeros) + (1 << zeros) - 1


def _frame_size(data: bytes, start: int, end: int) -> tuple[int, int]:
    """``max_frame_width_minus_1 + 1``, ``max_frame_height_minus_1 + 1`` of a sequence header OBU (AV1 spec, 5.5.1)."""
    bits = _Bits(data, start, end)
    bits.f(3)  # seq_profile
    bits.f(1)  # still_picture
    if bits.f(1):  # reduced_still_picture_header
        bits.f(5)  # seq_level_idx[0]
    else:
        decoder_model, delay_length = False, 0
        if bits.f(1):  # timing_info_present_flag
            bits.f(32), bits.f(32)  # num_units_in_display_tick, time_scale
            if bits.f(1):  # equal_picture_interval
                bits.uvlc()
            decoder_model = bool(bits.f(1))
            if decoder_model:
                delay_length = bits.f(5) + 1
                bits.f(32), bits.f(5), bits.f(5)
        display_delay = bits.f(1)
        for _ in range(bits.f(5) + 1):  # operating points
            bits.f(12)
            if bits.f(5) > 7:  # seq_level_idx
                bits.f(1)
            if decoder_model and bits.f(1):
                bits.f(delay_length), bits.f(delay_length), bits.f(1)
            if display_delay and bits.f(1):
                bits.f(4)
    width_bits, height_bits = bits.f(4) + 1, bits.f(4) + 1
    return bits.f(width_bits) + 1, bits.f(height_bits) + 1


def _largest_frame(data: bytes, start: int, end: int) -> tuple[int, int]:
    """The largest frame any sequence header in an item's data declares ((0, 0): none read).

    Raises:
        PayloadTooLarge: more OBUs or sequence headers than a still image holds (each was a way
            to hide a larger frame's header from a bounded walk).
    """
    pos, width, height, headers = start, 0, 0, 0
    for obus in range(_MAX_OBUS + 1):
        if pos >= end:
            break
        if obus == _MAX_OBUS:
            raise PayloadTooLarge(
                f"the AVIF image's item holds more than {_MAX_OBUS} AV1 OBUs; a still image holds a handful"
            )
        header = data[pos]
        kind, extension, sized = (header >> 3) & 15, (header >> 2) & 1, (header >> 1) & 1
        pos += 1 + extension
        size = end - pos
        if sized:
            size = shift = 0
            while pos < end and shift < 56:  # leb128 (AV1 spec, 4.10.5)
                byte = data[pos]
                pos += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
        if kind == _SEQUENCE_HEADER:
            headers += 1
            if headers > _MAX_HEADERS:
                raise PayloadTooLarge(
                    f"the AVIF image's item holds more than {_MAX_HEADERS} AV1 sequence headers; a still image "
                    "holds one"
                )
            try:
                w, h = _frame_size(data, pos, min(pos + size, end))
            except EOFError:
                break
            width, height = max(width, w), max(height, h)
        pos += size
    return width, height


def coded_items(data: bytes) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Each AV1 item with an ``ispe``: (its first ``ispe`` (width, height), the largest frame the sequence
    headers in its data declare, (0, 0) when none was read). Empty when the file's ``meta`` cannot be followed.

    Raises:
        PayloadTooLarge: more boxes, items, extents or OBUs than the walk reads, or items overlapping (413).
    """
    n = len(data)
    meta = _child(data, 0, n, b"meta")
    if meta is None:
        return []
    start, end = meta[0] + 4, meta[1]  # a FullBox: version and flags first
    iloc, iprp, idat = (_child(data, start, end, kind) for kind in (b"iloc", b"iprp", b"idat"))
    if iloc is None or iprp is None:
        return []
    sizes = _properties(data, *iprp)
    located = {item: spans for item, spans in _locations(data, *iloc, idat).items() if item in sizes}
    if sum(len(spans) for spans in located.values()) > _MAX_SPANS:
        raise PayloadTooLarge(f"the AVIF image has more than {_MAX_SPANS} coded item extents: a parser bomb?")
    ranges = [[(offset, min(offset + length, n)) for offset, length in spans] for spans in located.values()]
    if sum(max(stop - first, 0) for spans in ranges for first, stop in spans) > n:
        raise PayloadTooLarge("the AVIF image's coded items overlap (they name more bytes than the file holds)")
    found = []
    for item, extents in zip(located, ranges, strict=True):
        if len(extents) == 1:  # read in place
            found.append((sizes[item], _largest_frame(data, *extents[0])))
        else:  # libavif concatenates an item's extents: an OBU may straddle two
            joined = b"".join(data[first:stop] for first, stop in extents)
            found.append((sizes[item], _largest_frame(joined, 0, len(joined))))
    return found


def _path(data: bytes, start: int, end: int, *kinds: bytes) -> tuple[int, int] | None:
    """The payload of the box reached through ``kinds``, each the first child of its kind, or None."""
    span: tuple[int, int] | None = (start, end)
    for kind in kinds:
        if span is None:
            return None
        span = _child(data, *span, kind)
    return span


def _first_sample(data: bytes, stbl: tuple[int, int]) -> tuple[int, int] | None:
    """(start, end) in ``data`` of a track's first sample: its first chunk's offset (``stco``/``co64``)
    and its size (``stsz``), ISO/IEC 14496-12, 8.7.3 and 8.7.5. None when the table cannot say."""
    stsz, stco, co64 = (_child(data, *stbl, kind) for kind in (b"stsz", b"stco", b"co64"))
    if stsz is None or (stco is None and co64 is None):
        return None
    uniform, count = struct.unpack_from(">II", data, stsz[0] + 4)
    if count == 0:
        return None
    size = uniform or struct.unpack_from(">I", data, stsz[0] + 12)[0]
    if stco is not None:
        (offset,) = struct.unpack_from(">I", data, stco[0] + 8)
    else:
        assert co64 is not None
        (offset,) = struct.unpack_from(">Q", data, co64[0] + 8)
    return offset, min(offset + size, len(data))


def sequence_tracks(data: bytes) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Each AV1 track of an image sequence: (the smaller of its ``tkhd`` and ``av01`` sample entry's width
    and height, the largest frame the sequence headers of its ``av1C`` and its first sample declare).
    Tracks whose ``tkhd``, sample entry or sample tables cannot be followed are left out.

    Raises:
        PayloadTooLarge: more boxes or OBUs than the walk reads (413).
    """
    moov = _child(data, 0, len(data), b"moov")
    found: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for kind, start, end in _boxes(data, *moov) if moov is not None else ():
        tkhd = _child(data, start, end, b"tkhd") if kind == b"trak" else None
        stsd = _path(data, start, end, b"mdia", b"minf", b"stbl", b"stsd")
        if tkhd is None or stsd is None:
            continue
        # tkhd (8.3.2): version and flags, times, track_ID, duration; reserved, layer, group, volume; matrix
        at = tkhd[0] + 4 + (32 if data[tkhd[0]] == 1 else 20) + 16 + 36
        width, height = (value >> 16 for value in struct.unpack_from(">II", data, at))  # 16.16 fixed point
        entry = next(((s, e) for k, s, e in _boxes(data, stsd[0] + 8, stsd[1]) if k == b"av01"), None)
        if entry is None:  # not an AV1 track
            continue
        entry_width, entry_height = struct.unpack_from(">HH", data, entry[0] + 24)  # VisualSampleEntry (12.1.3)
        av1c = _child(data, entry[0] + 78, entry[1], b"av1C")
        frames = [_largest_frame(data, av1c[0] + 4, av1c[1])] if av1c is not None else []  # configOBUs
        stbl = _path(data, start, end, b"mdia", b"minf", b"stbl")
        sample = _first_sample(data, stbl) if stbl is not None else None
        frames += [_largest_frame(data, *sample)] if sample is not None else []
        largest = (max((w for w, _ in frames), default=0), max((h for _, h in frames), default=0))
        found.append(((min(width, entry_width), min(height, entry_height)), largest))
    return found


def scan_avif(data: bytes, limits: PrescanLimits) -> None:
    """Refuse an AVIF whose AV1 frame is larger than its item's ``ispe`` or its track's size (module docstring).

    Raises:
        PayloadTooLarge: a coded item whose sequence header declares a frame wider or taller than
            the item's ``ispe`` property, or a track whose does than its ``tkhd`` or sample entry (413).
    """
    for walk, declares in ((coded_items, "its item declares (ispe)"), (sequence_tracks, "its track declares")):
        try:
            pairs = walk(data)
        except (struct.error, IndexError):  # cut short where the walk reads: libavif reports it corrupt
            continue
        for declared, frame in pairs:
            if frame[0] > declared[0] or frame[1] > declared[1]:
                raise PayloadTooLarge(
                    f"the AVIF image's AV1 frame is {frame[0]}x{frame[1]}, larger than the "
                    f"{declared[0]}x{declared[1]} {declares}, which is what its pixels are counted by: a decoding bomb?"
                )
