"""The AV1 headers the AVIF pre-scan reads: the frame sizes a sequence header allows (AV1 spec, 5.5.1).

dav1d decodes a frame at the size its frame header codes. Without an override that is the sequence
header's maximum (``max_frame_width_minus_1 + 1``); with ``frame_size_override_flag`` (a frame
header's, 5.9.2, possible unless the header is a reduced still-picture one) it is any size that
fits in ``frame_width_bits`` bits, and dav1d does not hold it to the maximum (a reviewer's 1,867-byte
still with a 16x16 maximum and a 12000x12000 override took +285 MiB). :class:`FrameBound` gives
both, so the pre-scan can hold each to the size Pillow will report.
"""

from __future__ import annotations

from typing import NamedTuple

from service.core.errors import PayloadTooLarge

SEQUENCE_HEADER = 1  # obu_type (AV1 spec, 6.2.2)
MAX_HEADERS = 4  # sequence headers in one item or sample: a still image's is one
MAX_OBUS = 16_384  # OBUs walked in one file, every item and track together: a still's are a handful
MAX_HEADER_BYTES = 65_536  # sequence headers' bytes read in one file: a 1,024-tile grid's are about 12 KB


class FrameBound(NamedTuple):
    """The largest frames the sequence headers read allow, pixels: ``maximum`` (width, height) as
    declared, ``codable`` the largest a frame header can code ((0, 0) for both: none read)."""

    maximum: tuple[int, int]
    codable: tuple[int, int]

    def join(self, other: FrameBound) -> FrameBound:
        """The larger of both, per dimension."""
        return FrameBound(
            (max(self.maximum[0], other.maximum[0]), max(self.maximum[1], other.maximum[1])),
            (max(self.codable[0], other.codable[0]), max(self.codable[1], other.codable[1])),
        )


NONE = FrameBound((0, 0), (0, 0))


class ObuBudget:
    """OBUs (:data:`MAX_OBUS`) and sequence-header bytes (:data:`MAX_HEADER_BYTES`) the walk may still
    read in one file: every item and track shares them, so thousands of tracks or items over heavy
    headers cost bounded CPU (4,095 tracks over one sample took 4.5 s of Python; 1,024 items of four
    maximal headers, 1.16 s)."""

    def __init__(self, obus: int = MAX_OBUS, header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.left, self.header_bytes = obus, header_bytes

    def read_header(self, size: int) -> None:
        """A sequence header of ``size`` bytes is about to be read. Raises PayloadTooLarge when the
        file's header bytes are spent."""
        self.header_bytes -= size
        if self.header_bytes < 0:
            raise PayloadTooLarge(
                f"the AVIF image holds more than {MAX_HEADER_BYTES} bytes of AV1 sequence headers: a parser bomb?"
            )

    def spend(self) -> None:
        """One OBU more. Raises PayloadTooLarge when none is left."""
        self.left -= 1
        if self.left < 0:
            raise PayloadTooLarge(
                f"the AVIF image holds more than {MAX_OBUS} AV1 OBUs in its items and tracks: a parser bomb?"
            )


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


def sequence_bound(data: bytes, start: int, end: int) -> FrameBound:
    """One sequence header OBU's payload: its maximum frame size and, unless it is a reduced
    still-picture header (no frame can override the size then), the largest its bit widths code.

    Raises:
        EOFError: the header ends before its frame size.
    """
    bits = _Bits(data, start, end)
    bits.f(3)  # seq_profile
    bits.f(1)  # still_picture
    reduced = bool(bits.f(1))  # reduced_still_picture_header
    if reduced:
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
    maximum = (bits.f(width_bits) + 1, bits.f(height_bits) + 1)
    return FrameBound(maximum, maximum if reduced else (1 << width_bits, 1 << height_bits))


def stream_bound(data: bytes, start: int, end: int, budget: ObuBudget) -> FrameBound:
    """The largest frames the sequence headers in an OBU stream (an item's data, a sample) allow.

    Raises:
        PayloadTooLarge: more sequence headers than a still image holds, or the file's OBU budget
            spent (each was a way to hide a larger frame's header from a bounded walk).
    """
    pos, bound, headers = start, NONE, 0
    while pos < end:
        budget.spend()
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
        if kind == SEQUENCE_HEADER:
            headers += 1
            if headers > MAX_HEADERS:
                raise PayloadTooLarge(
                    f"the AVIF image's item or sample holds more than {MAX_HEADERS} AV1 sequence headers; "
                    "a still image holds one"
                )
            budget.read_header(min(pos + size, end) - pos)
            try:
                bound = bound.join(sequence_bound(data, pos, min(pos + size, end)))
            except EOFError:
                break
        pos += size
    return bound
