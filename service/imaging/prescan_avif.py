"""Pre-scanning an AVIF (ISO/IEC 23008-12 HEIF items, AV1 Image File Format) before it is decoded.

Pillow reports the size libavif gives: a still's primary item's ``ispe``, an image sequence's
track's ``tkhd``; the pixel limit and the worker's budget count that size. But libavif hands the
AV1 bitstream to dav1d, which decodes each frame at the size the bitstream codes, up to libavif's
16384x16384: a sequence header's maximum, or a frame header's override
(:mod:`service.imaging.prescan_av1`). Reviewers hid 12000x12000 frames behind 16x16 declarations
in a dozen ways (+283 to +298 MiB each, 256 pixels reserved): in an item's ``ispe``, behind a
second ``ispe``, in an image sequence's track, in an alpha item or track larger than the colour
one, in a frame header's size override. This walk reads what libavif will and refuses (413) a
frame larger than what is declared:

* each coded item (``av1C``, through ``iloc`` and ``ipma``): its sequence headers' maximum may not
  exceed its first ``ispe`` (the one libavif reads), nor the largest frame their bit widths code
  twice its ``ispe`` (what encoders write is the fewest bits for the maximum, under twice it; a
  wider field is room for an override), and its ``ispe`` may not exceed the primary item's;
* each AV1 track of an image sequence (``moov``/``trak``, ISO/IEC 14496-12, 8.3): the sequence
  headers of its sample entry's ``av1C`` and of its first sample (libavif decodes that one for the
  first frame) likewise against the smaller of its ``tkhd`` and ``av01`` sample entry, and each
  track's size against the smallest track's (an alpha track is the colour one's size).

A sequence's tables are read strictly: one ``mdia``, ``minf``, ``stbl``, ``stsd``, ``stsz`` and
chunk-offset table each, none empty, every read inside its box; where libavif could read a file
otherwise than this walk (two ``mdia`` boxes, ``stco`` beside ``co64``), it is refused as
uncheckable (415). The walk's own cost is bounded: the OBUs of every item and track together
(:data:`~service.imaging.prescan_av1.MAX_OBUS`), at most :data:`MAX_TRACKS` AV1 tracks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from service.core.errors import InvalidImage, PayloadTooLarge
from service.imaging.prescan_av1 import NONE, FrameBound, ObuBudget, stream_bound
from service.imaging.prescan_limits import PrescanLimits

_MAX_BOXES = 4096  # boxes walked in one container; an AVIF still holds a few dozen
_MAX_SPANS = 1024  # item extents walked in one file: a grid of 32x32 tiles
MAX_TRACKS = 8  # AV1 tracks in one image sequence: colour and alpha are two


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


def _properties(data: bytes, start: int, end: int) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """``iprp``: (item ID -> its first ``ispe`` (width, height), the IDs of the items with an ``av1C``),
    through ``ipco`` and ``ipma`` (ISO/IEC 23008-12, 9.3). Only the AV1 items are coded here: a HEIF's
    HEVC items share the container, not the codec; a grid has an ``ispe`` and no codec."""
    ipco = _child(data, start, end, b"ipco")
    if ipco is None:
        return {}, set()
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
    return found, coded


def coded_items(data: bytes, budget: ObuBudget | None = None) -> list[tuple[tuple[int, int], FrameBound]]:
    """Each AV1 item with an ``ispe``: (its first ``ispe`` (width, height), the frames the sequence
    headers in its data allow, :data:`~service.imaging.prescan_av1.NONE` when none was read); the
    primary item's size as the first row's when it is not itself coded (a grid). Empty when the
    file's ``meta`` cannot be followed.

    Raises:
        PayloadTooLarge: more boxes, items, extents or OBUs than the walk reads, items overlapping,
            or a coded item larger than the primary item (413).
    """
    budget = budget or ObuBudget()
    n = len(data)
    meta = _child(data, 0, n, b"meta")
    if meta is None:
        return []
    start, end = meta[0] + 4, meta[1]  # a FullBox: version and flags first
    iloc, iprp, idat, pitm = (_child(data, start, end, kind) for kind in (b"iloc", b"iprp", b"idat", b"pitm"))
    if iloc is None or iprp is None:
        return []
    every, coded = _properties(data, *iprp)
    sizes = {item: size for item, size in every.items() if item in coded}
    primary = every.get(_uint(data, pitm[0] + 4, 2 if data[pitm[0]] == 0 else 4)) if pitm is not None else None
    for size in sizes.values():
        if primary is not None and (size[0] > primary[0] or size[1] > primary[1]):  # a larger alpha: +286 MiB
            raise PayloadTooLarge(
                f"the AVIF image has a {size[0]}x{size[1]} item inside its {primary[0]}x{primary[1]} image "
                "(ispe), which is what its pixels are counted by: a decoding bomb?"
            )
    located = {item: spans for item, spans in _locations(data, *iloc, idat).items() if item in sizes}
    if sum(len(spans) for spans in located.values()) > _MAX_SPANS:
        raise PayloadTooLarge(f"the AVIF image has more than {_MAX_SPANS} coded item extents: a parser bomb?")
    ranges = [[(offset, min(offset + length, n)) for offset, length in spans] for spans in located.values()]
    if sum(max(stop - first, 0) for spans in ranges for first, stop in spans) > n:
        raise PayloadTooLarge("the AVIF image's coded items overlap (they name more bytes than the file holds)")
    found = []
    for item, extents in zip(located, ranges, strict=True):
        if len(extents) == 1:  # read in place
            found.append((sizes[item], stream_bound(data, *extents[0], budget)))
        else:  # libavif concatenates an item's extents: an OBU may straddle two
            joined = b"".join(data[first:stop] for first, stop in extents)
            found.append((sizes[item], stream_bound(joined, 0, len(joined), budget)))
    return found


def _unreadable(why: str) -> InvalidImage:
    return InvalidImage(
        f"the AVIF image sequence cannot be checked before decoding ({why}); send its first frame as a still image"
    )


def _only(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int]:
    """The payload of the one child box of ``kind`` (415 when there is none, or several)."""
    found = [(s, e) for k, s, e in _boxes(data, start, end) if k == kind]
    if len(found) != 1:
        raise _unreadable(f"{len(found)} {kind.decode('latin-1')} boxes where libavif reads one")
    return found[0]


def _read(layout: str, data: bytes, pos: int, end: int) -> tuple[int, ...]:
    """``struct.unpack_from(layout)`` at ``pos``, inside ``[pos, end)`` (415 past it)."""
    if pos + struct.calcsize(layout) > end:
        raise _unreadable("a table shorter than its fields")
    return struct.unpack_from(layout, data, pos)


def _first_sample(data: bytes, stbl: tuple[int, int]) -> tuple[int, int]:
    """(start, end) of a track's first sample: the first chunk's offset (``stco`` or ``co64``) and the
    first size (``stsz``), ISO/IEC 14496-12, 8.7.3 and 8.7.5 (stsc cannot leave the first chunk empty)."""
    kinds = [k for k, _, _ in _boxes(data, *stbl)]
    if kinds.count(b"stco") + kinds.count(b"co64") != 1 or b"stz2" in kinds:
        raise _unreadable("not exactly one chunk-offset table, or a compact size table")
    stsz = _only(data, *stbl, b"stsz")
    uniform, count = _read(">II", data, stsz[0] + 4, stsz[1])
    size = uniform or _read(">I", data, stsz[0] + 12, stsz[1])[0]
    chunks, wide = (_only(data, *stbl, b"stco"), False) if b"stco" in kinds else (_only(data, *stbl, b"co64"), True)
    (entries,) = _read(">I", data, chunks[0] + 4, chunks[1])
    (offset,) = _read(">Q" if wide else ">I", data, chunks[0] + 8, chunks[1])
    if count == 0 or entries == 0 or offset >= len(data):
        raise _unreadable("no first sample")
    return offset, min(offset + size, len(data))


def sequence_tracks(data: bytes, budget: ObuBudget | None = None) -> list[tuple[tuple[int, int], FrameBound]]:
    """Each AV1 track of an image sequence: (the smaller of its ``tkhd`` and ``av01`` sample entry's width
    and height, the frames the sequence headers of its ``av1C`` and its first sample allow).

    Raises:
        InvalidImage: a track whose tables libavif could read otherwise than this walk (415).
        PayloadTooLarge: more tracks, boxes or OBUs than the walk reads (413).
    """
    budget = budget or ObuBudget()
    moovs = [(s, e) for k, s, e in _boxes(data, 0, len(data)) if k == b"moov"]
    if len(moovs) > 1:
        raise _unreadable("two moov boxes")
    found: list[tuple[tuple[int, int], FrameBound]] = []
    for kind, start, end in _boxes(data, *moovs[0]) if moovs else ():
        if kind != b"trak":
            continue
        stbl = _only(data, *_only(data, *_only(data, start, end, b"mdia"), b"minf"), b"stbl")
        stsd = _only(data, *stbl, b"stsd")
        entries = list(_boxes(data, stsd[0] + 8, stsd[1]))
        if not any(k == b"av01" for k, _, _ in entries):  # not an AV1 track: libavif does not decode it
            continue
        if len(entries) != 1:
            raise _unreadable("a sample description beside the AV1 one")
        if len(found) == MAX_TRACKS:
            raise PayloadTooLarge(f"the AVIF image sequence has more than {MAX_TRACKS} AV1 tracks: a parser bomb?")
        tkhd = _only(data, start, end, b"tkhd")
        # tkhd (8.3.2): version and flags, times, track_ID, duration; reserved, layer, group, volume; matrix
        at = tkhd[0] + 4 + (32 if data[tkhd[0]] == 1 else 20) + 16 + 36
        width, height = (value >> 16 for value in _read(">II", data, at, tkhd[1]))  # 16.16 fixed point
        _, entry_start, entry_end = entries[0]
        entry_width, entry_height = _read(">HH", data, entry_start + 24, entry_end)  # VisualSampleEntry (12.1.3)
        configs = [(s, e) for k, s, e in _boxes(data, entry_start + 78, entry_end) if k == b"av1C"]
        bound = NONE
        for config_start, config_end in configs[:1]:  # its configOBUs, after 4 bytes of fields
            bound = bound.join(stream_bound(data, config_start + 4, config_end, budget))
        bound = bound.join(stream_bound(data, *_first_sample(data, stbl), budget))
        found.append(((min(width, entry_width), min(height, entry_height)), bound))
    return found


def _too_large(frame: tuple[int, int], declared: tuple[int, int], what: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the AVIF image's AV1 frame is {frame[0]}x{frame[1]}, larger than the {declared[0]}x{declared[1]} {what}, "
        "which is what its pixels are counted by: a decoding bomb?"
    )


def scan_avif(data: bytes, limits: PrescanLimits) -> None:
    """Refuse an AVIF whose AV1 frames can be larger than what Pillow will count (module docstring).

    Raises:
        PayloadTooLarge: a sequence header whose maximum frame exceeds its item's ``ispe`` or its
            track's size, or whose bit widths code frames over twice it; an item larger than the
            primary item, a track larger than the smallest track; more of anything than the walk reads (413).
        InvalidImage: an image sequence this walk cannot follow as libavif would (415), or a meta
            whose tables end early.
    """
    budget = ObuBudget()
    try:
        items = coded_items(data, budget)
    except (struct.error, IndexError):  # a table cut short: libavif could read it otherwise
        raise InvalidImage("the AVIF image's item tables end early (it is corrupt)") from None
    tracks = sequence_tracks(data, budget)
    smallest = (min((w for (w, _), _ in tracks), default=0), min((h for (_, h), _ in tracks), default=0))
    for (width, height), _ in tracks:
        if width > smallest[0] or height > smallest[1]:  # an alpha track larger than the colour one: +286 MiB
            raise _too_large((width, height), smallest, "track beside it declares")
    for pairs, what in ((items, "its item declares (ispe)"), (tracks, "its track declares")):
        for declared, bound in pairs:
            if bound.maximum[0] > declared[0] or bound.maximum[1] > declared[1]:
                raise _too_large(bound.maximum, declared, what)
            if bound.codable[0] > 2 * declared[0] or bound.codable[1] > 2 * declared[1]:
                raise PayloadTooLarge(
                    f"the AVIF image's AV1 sequence header codes frames up to {bound.codable[0]}x{bound.codable[1]} "
                    f"(its frame size fields' widths), over twice the {declared[0]}x{declared[1]} {what}; a frame "
                    "header may override the size that far: a decoding bomb?"
                )
