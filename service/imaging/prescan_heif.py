"""The HEIF item structure (ISO/IEC 23008-12) and ISO BMFF boxes (ISO/IEC 14496-12) the AVIF pre-scan reads.

Every walk is bounded: at most :data:`MAX_BOXES` boxes in a container, items, item extents and
property associations in a file; beyond that the file is refused (413) rather than read in part,
since what lay beyond would go unread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from service.core.errors import PayloadTooLarge

MAX_BOXES = 4096  # boxes walked in one container; an AVIF still holds a few dozen
MAX_ASSOCIATIONS = 65_536  # item-property associations in one file: a 1,024-tile grid has about 5,000


def boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, payload end) of the boxes in ``data[start:end]`` (ISO/IEC 14496-12, 4.2)."""
    pos, seen = start, 0
    while pos + 8 <= end:
        if seen == MAX_BOXES:  # what lies beyond would go unread: refused rather than skipped
            raise too_many("boxes in one container")
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


def too_many(what: str, limit: int = MAX_BOXES) -> PayloadTooLarge:
    return PayloadTooLarge(f"the AVIF image has more than {limit} {what}; a still image holds a few dozen")


def child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((s, e) for k, s, e in boxes(data, start, end) if k == kind), None)


def uint(data: bytes, pos: int, size: int) -> int:
    return int.from_bytes(data[pos : pos + size], "big") if size else 0


def locations(data: bytes, start: int, end: int, idat: tuple[int, int] | None) -> dict[int, list[tuple[int, int]]]:
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
    count = uint(data, pos, width)
    pos += width
    found: dict[int, list[tuple[int, int]]] = {}
    extents_left = MAX_BOXES  # in all items: each may take no bytes (offset and length sizes of 0)
    if count > MAX_BOXES:
        raise too_many("items")
    for _ in range(count):
        item = uint(data, pos, width)
        pos += width
        method = 0
        if version in (1, 2):
            method = data[pos + 1] & 15
            pos += 2
        pos += 2  # data_reference_index
        base = uint(data, pos, base_size)
        pos += base_size
        extents = uint(data, pos, 2)
        pos += 2
        extents_left -= extents
        if extents_left < 0:
            raise too_many("item extents")
        spans = []
        for _ in range(extents):
            pos += index_size if version in (1, 2) else 0
            offset, length = uint(data, pos, offset_size), uint(data, pos + offset_size, length_size)
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


class Properties(NamedTuple):
    """What ``iprp`` associates with the items (ISO/IEC 23008-12, 9.3).

    Attributes:
        sizes: item ID -> its first ``ispe`` (width, height), as libavif reads it (a second,
            larger one hid a frame).
        coded: the IDs of the items with an ``av1C``. Only AV1 items are coded here: a HEIF's HEVC
            items share the container, not the codec; a grid has an ``ispe`` and no codec.
        selections: coded item ID -> (its first ``a1op`` operating point, its first ``lsel`` layer,
            as libavif reads them; 0 and 0xFFFF when absent). libavif gives items that differ a
            dav1d decoder each (a second ``a1op`` of 0 after one of 1 hid the difference).
    """

    sizes: dict[int, tuple[int, int]]
    coded: set[int]
    selections: dict[int, tuple[int, int]]


def properties(data: bytes, start: int, end: int) -> Properties:
    """``iprp``'s ``ipco`` and ``ipma``: the items' sizes, codecs and layer selections.

    Raises:
        PayloadTooLarge: more than :data:`MAX_ASSOCIATIONS` associations in all ``ipma`` boxes
            together (20 MB of them had cost 4.65 s of walking), or more entries in one (413).
    """
    ipco = child(data, start, end, b"ipco")
    if ipco is None:
        return Properties({}, set(), {})
    listed = list(enumerate(boxes(data, *ipco), start=1))
    spatial = {
        index: struct.unpack_from(">II", data, s + 4)
        for index, (kind, s, e) in listed
        if kind == b"ispe" and e - s >= 12
    }
    av1 = {index for index, (kind, _, _) in listed if kind == b"av1C"}
    operating = {index: data[s] for index, (kind, s, e) in listed if kind == b"a1op" and e - s >= 1}
    layer = {index: uint(data, s, 2) for index, (kind, s, e) in listed if kind == b"lsel" and e - s >= 2}
    found: dict[int, tuple[int, int]] = {}
    coded: set[int] = set()
    first_point: dict[int, int] = {}
    first_layer: dict[int, int] = {}
    total = 0
    for kind, s, e in boxes(data, start, end):
        if kind != b"ipma" or e - s < 8:
            continue
        version, large = data[s], data[s + 3] & 1
        pos = s + 4
        (count,) = struct.unpack_from(">I", data, pos)
        pos += 4
        width = 2 if version < 1 else 4
        if count > MAX_BOXES:
            raise too_many("property associations")
        for _ in range(count):
            if pos + width + 1 > e:
                break
            item, associations = uint(data, pos, width), data[pos + width]
            pos += width + 1
            total += associations
            if total > MAX_ASSOCIATIONS:
                raise too_many("property associations in all", MAX_ASSOCIATIONS)
            if pos + associations * (2 if large else 1) > e:
                break
            for _ in range(associations):
                index = uint(data, pos, 2 if large else 1) & (0x7FFF if large else 0x7F)
                pos += 2 if large else 1
                if index in spatial:
                    found.setdefault(item, spatial[index])
                coded.update((item,) if index in av1 else ())
                if index in operating:  # the first of each, as libavif finds it (avifPropertyArrayFind)
                    first_point.setdefault(item, operating[index])
                if index in layer:
                    first_layer.setdefault(item, layer[index])
    return Properties(found, coded, {item: (first_point.get(item, 0), first_layer.get(item, 0xFFFF)) for item in coded})


def item_types(data: bytes, start: int, end: int) -> dict[int, bytes]:
    """``iinf``'s item ID -> item type (``av01``, ``grid``, ``Exif`` ...), from ``infe`` boxes of
    version 2 or 3 (ISO/IEC 14496-12, 8.11.6), the ones HEIF uses."""
    offset = 4 + (2 if data[start] == 0 else 4)  # FullBox, then entry_count
    found: dict[int, bytes] = {}
    for kind, s, e in boxes(data, start + offset, end):
        if kind != b"infe" or e - s < 8 or data[s] < 2:
            continue
        width = 2 if data[s] == 2 else 4
        if s + 4 + width + 6 <= e:
            found[uint(data, s + 4, width)] = data[s + 4 + width + 2 : s + 4 + width + 6]
    return found


def grid_output(payload: bytes) -> tuple[int, int] | None:
    """A ``grid`` item's output (width, height) from its data (ISO/IEC 23008-12, 6.6.2.3.2: version,
    flags, rows - 1, columns - 1, then 16- or 32-bit output sizes), or None when it is cut short."""
    if len(payload) < 4:
        return None
    size = 4 if payload[1] & 1 else 2
    if len(payload) < 4 + 2 * size:
        return None
    return uint(payload, 4, size), uint(payload, 4 + size, size)
