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
  wider field is room for an override), and its ``ispe`` may not exceed the primary item's; a
  grid's output (in its own data, ISO/IEC 23008-12, 6.6.2.3) may not exceed its ``ispe``, which
  is what libavif decodes to; and every coded item must select the same operating point and layer
  (``a1op``, ``lsel``), or libavif gives each tile a dav1d of its own;
* each AV1 track of an image sequence (``moov``/``trak``, ISO/IEC 14496-12, 8.3): the sequence
  headers of its sample entry's ``av1C`` and of its first sample (libavif decodes that one for the
  first frame) likewise against the smaller of its ``tkhd`` and ``av01`` sample entry, and each
  track's size against the smallest track's (an alpha track is the colour one's size).

A sequence's tables are read strictly: one ``mdia``, ``minf``, ``stbl``, ``stsd``, ``stsz`` and
chunk-offset table each, none empty, every read inside its box; where libavif could read a file
otherwise than this walk (two ``mdia`` boxes, ``stco`` beside ``co64``), it is refused as
uncheckable (415). The walk's own cost is bounded: the OBUs and sequence-header bytes of every
item and track together (:mod:`service.imaging.prescan_av1`), the property associations
(:mod:`service.imaging.prescan_heif`), at most :data:`MAX_TRACKS` AV1 tracks.
"""

from __future__ import annotations

import struct

from service.core.errors import InvalidImage, PayloadTooLarge
from service.imaging.prescan_av1 import NONE, FrameBound, ObuBudget, stream_bound
from service.imaging.prescan_heif import boxes, child, grid_output, item_types, locations, properties, uint
from service.imaging.prescan_limits import PrescanLimits

_MAX_SPANS = 1024  # item extents walked in one file: a grid of 32x32 tiles
MAX_TRACKS = 8  # AV1 tracks in one image sequence: colour and alpha are two


def is_avif(data: bytes) -> bool:
    """An ISO BMFF file (``ftyp`` first) whose major brand is AVIF's, as Pillow's plugin accepts it."""
    return data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis", b"mif1", b"msf1")


def coded_items(data: bytes, budget: ObuBudget | None = None) -> list[tuple[tuple[int, int], FrameBound]]:
    """Each AV1 item with an ``ispe``: (its first ``ispe`` (width, height), the frames the sequence
    headers in its data allow, :data:`~service.imaging.prescan_av1.NONE` when none was read). Empty
    when the file's ``meta`` cannot be followed.

    Raises:
        PayloadTooLarge: more boxes, items, extents, associations or OBUs than the walk reads, items
            overlapping, a coded item larger than the primary item, a grid whose output is larger
            than its ``ispe``, items choosing different operating points or layers (413).
    """
    budget = budget or ObuBudget()
    n = len(data)
    meta = child(data, 0, n, b"meta")
    if meta is None:
        return []
    start, end = meta[0] + 4, meta[1]  # a FullBox: version and flags first
    iloc, iprp, idat, pitm, iinf = (
        child(data, start, end, kind) for kind in (b"iloc", b"iprp", b"idat", b"pitm", b"iinf")
    )
    if iloc is None or iprp is None:
        return []
    declared = properties(data, *iprp)
    sizes = {item: size for item, size in declared.sizes.items() if item in declared.coded}
    primary = declared.sizes.get(uint(data, pitm[0] + 4, 2 if data[pitm[0]] == 0 else 4)) if pitm else None
    for size in sizes.values():
        if primary is not None and (size[0] > primary[0] or size[1] > primary[1]):  # a larger alpha: +286 MiB
            raise PayloadTooLarge(
                f"the AVIF image has a {size[0]}x{size[1]} item inside its {primary[0]}x{primary[1]} image "
                "(ispe), which is what its pixels are counted by: a decoding bomb?"
            )
    if len(set(declared.selections.values())) > 1:  # libavif then decodes each tile in a dav1d of its own
        raise PayloadTooLarge(
            "the AVIF image's items select different AV1 operating points or layers (a1op, lsel), which "
            "gives each its own decoder: 256 such tiles took +1.1 GiB. A decoding bomb?"
        )
    everywhere = locations(data, *iloc, idat)
    for item, kind in item_types(data, *iinf).items() if iinf is not None else ():
        spans = everywhere.get(item, []) if kind == b"grid" else []
        output = grid_output(b"".join(data[first : first + length] for first, length in spans)[:12])
        stated = declared.sizes.get(item)
        if output is not None and stated is not None and (output[0] > stated[0] or output[1] > stated[1]):
            raise PayloadTooLarge(  # libavif decodes to the grid's own output size (+1.9 GiB behind 1 MP)
                f"the AVIF image's grid is {output[0]}x{output[1]}, larger than the {stated[0]}x{stated[1]} it "
                "declares (ispe), which is what its pixels are counted by: a decoding bomb?"
            )
    located = {item: spans for item, spans in everywhere.items() if item in sizes}
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
    found = [(s, e) for k, s, e in boxes(data, start, end) if k == kind]
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
    kinds = [k for k, _, _ in boxes(data, *stbl)]
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
    moovs = [(s, e) for k, s, e in boxes(data, 0, len(data)) if k == b"moov"]
    if len(moovs) > 1:
        raise _unreadable("two moov boxes")
    found: list[tuple[tuple[int, int], FrameBound]] = []
    for kind, start, end in boxes(data, *moovs[0]) if moovs else ():
        if kind != b"trak":
            continue
        stbl = _only(data, *_only(data, *_only(data, start, end, b"mdia"), b"minf"), b"stbl")
        stsd = _only(data, *stbl, b"stsd")
        entries = list(boxes(data, stsd[0] + 8, stsd[1]))
        if not any(k == b"av01" for k, _, _ in entries):  # not an AV1 track: libavif does not decode it
            continue
        if len(entries) != 1:
            raise _unreadable("a sample description beside the AV1 one")
        if len(found) == MAX_TRACKS:
            raise PayloadTooLarge(f"the AVIF image sequence has more than {MAX_TRACKS} AV1 tracks: a parser bomb?")
        tkhd = _only(data, start, end, b"tkhd")
        # tkhd (8.3.2): version and flags, times, track_ID, duration; reserved, layer, group, volume; matrix
        at = tkhd[0] + 4 + (32 if _read(">B", data, tkhd[0], tkhd[1])[0] == 1 else 20) + 16 + 36
        width, height = (value >> 16 for value in _read(">II", data, at, tkhd[1]))  # 16.16 fixed point
        _, entry_start, entry_end = entries[0]
        entry_width, entry_height = _read(">HH", data, entry_start + 24, entry_end)  # VisualSampleEntry (12.1.3)
        configs = [(s, e) for k, s, e in boxes(data, entry_start + 78, entry_end) if k == b"av1C"]
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
    try:
        tracks = sequence_tracks(data, budget)
    except (struct.error, IndexError):  # every read is bounded; a safety net, as for the items
        raise _unreadable("a table cut short") from None
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
