"""A still WebP decoded by libwebp straight to about twice the input size (its built-in rescaler),
and an animation's first frame decoded the same way, on its own, and drawn on its scaled canvas.

Optional: without the ``webp`` package (libwebp's decode API through cffi) Pillow decodes every
WebP at full size.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np
from PIL import Image

try:
    import webp  # libwebp's decode API through cffi (the webp package): scaled WebP decoding

    _HAVE_WEBP = True
except ImportError:  # without it, Pillow decodes every WebP at full size (webp is then never read)
    _HAVE_WEBP = False
# libwebp's WebPDecoderOptions (src/webp/decode.h) is 14 ints and 5 uint32 of padding; the webp
# package declares only use_threads, its 11th int. use_scaling, scaled_width and scaled_height
# are the 8th to 10th: written by index, once the package's layout is the one decode.h gives.
_SCALING = 7
_WEBP_SCALES = _HAVE_WEBP and (
    webp.ffi.offsetof("WebPDecoderOptions", "use_threads") == 40 and webp.ffi.sizeof("WebPDecoderOptions") == 76
)


def webp_scaled(data: bytes, size: tuple[int, int], target: tuple[int, int], alpha: bool) -> Image.Image | None:
    """A still WebP decoded by libwebp straight to about twice ``target`` (its built-in rescaler).

    Pillow decodes a WebP through libwebp's animation API, which holds two full canvases and
    hands Pillow a third copy: a 1.6 KB lossless 6300x6300 WebP took 608 MiB at peak. Decoding
    with ``WebPDecode`` and ``options.use_scaling`` (libwebp's decode.h) writes only the scaled
    rows, so the peak is the lossless decoder's own ARGB plane (4 bytes per pixel) or, for a
    lossy file, a few macroblock rows. Like a JPEG's draft, the result is at least ``target``
    in both sides (about twice it), never larger than the image; what the preprocessor then
    resizes is this picture.

    Args:
        data: the WebP file.
        size: (width, height) of the stored image, in pixels.
        target: (width, height), in stored orientation, the preprocessor will resize to at least.
        alpha: decode RGBA (the file has alpha) rather than RGB.

    Returns:
        An "RGB" or "RGBA" image, or None when scaling would not shrink it, the bitstream is not
        ``size``, or libwebp cannot decode the file this way (then Pillow decodes it, and reports
        any fault).
    """
    scaled = _scaled_size(size, target)
    return None if scaled is None else _decode_to(data, size, scaled, alpha)


def _scaled_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int] | None:
    """About twice ``target``, aspect kept, never larger than ``size``; None when that would not
    halve the pixels (not worth a second path: Pillow decodes it), or without the ``webp`` package."""
    if not _WEBP_SCALES:
        return None
    width, height = size
    scale = min(1.0, 2 * max(target[0] / width, target[1] / height))
    scaled = (max(1, min(width, math.ceil(width * scale))), max(1, min(height, math.ceil(height * scale))))
    return None if scaled[0] * scaled[1] * 2 > width * height else scaled


def _decode_to(data: bytes, size: tuple[int, int], scaled: tuple[int, int], alpha: bool) -> Image.Image | None:
    """A still WebP of ``size`` decoded by libwebp's rescaler to ``scaled`` (None: it is not ``size``,
    or libwebp cannot decode it so)."""
    source = webp.ffi.from_buffer(data)
    features = webp.ffi.new("WebPBitstreamFeatures *")
    status = webp.lib.WebPGetFeatures(webp.ffi.cast("uint8_t*", source), len(data), features)
    if status != webp.lib.VP8_STATUS_OK or (features.width, features.height) != size:
        return None  # a bitstream larger than what was counted (an animation's frame): Pillow checks it
    channels, mode = (4, webp.WebPColorMode.RGBA) if alpha else (3, webp.WebPColorMode.RGB)
    pixels = np.empty((scaled[1], scaled[0], channels), dtype=np.uint8)  # (H, W, C)
    config = webp.WebPDecoderConfig.new()
    options = webp.ffi.cast("int *", webp.ffi.addressof(config.ptr, "options"))
    options[_SCALING], options[_SCALING + 1], options[_SCALING + 2] = 1, *scaled
    config.output.colorspace = mode.value
    config.output.is_external_memory = 1
    config.output.u.RGBA.rgba = webp.ffi.cast("uint8_t*", webp.ffi.from_buffer(pixels))
    config.output.u.RGBA.size = pixels.size
    config.output.u.RGBA.stride = scaled[0] * channels
    status = webp.lib.WebPDecode(webp.ffi.cast("uint8_t*", source), len(data), config.ptr)
    webp.lib.WebPFreeDecBuffer(webp.ffi.addressof(config.ptr, "output"))
    if status != webp.lib.VP8_STATUS_OK:
        return None
    return Image.fromarray(pixels, "RGBA" if alpha else "RGB")


def _chunks(data: bytes, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """(FourCC, payload start, payload end) of the RIFF chunks in ``data[start:end]`` (WebP container
    spec: a little-endian size, the payload padded to an even length); stops at one cut short."""
    found: list[tuple[bytes, int, int]] = []
    pos = start
    while pos + 8 <= end and len(found) < 64:  # an animation's header chunks and one frame's: a handful
        tag, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if pos + 8 + size > end:
            break
        found.append((tag, pos + 8, pos + 8 + size))
        pos += 8 + size + (size & 1)
    return found


def _chunk(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload + b"\0" * (len(payload) & 1)


class FirstFrame(NamedTuple):
    """An animated WebP's first frame: ``still``, a WebP file of its own; ``box`` (x, y, width,
    height) where it lies on the canvas, pixels."""

    still: bytes
    box: tuple[int, int, int, int]


def first_frame(data: bytes) -> FirstFrame | None:
    """An animated WebP's first frame as a still WebP file, and where it lies on the canvas (what
    libwebp's animation decoder draws first, onto a transparent canvas, whatever the blending).

    Pillow decodes an animation through libwebp's animation decoder, three full RGBA canvases at
    once: two 6300x6300 frames took +609 MiB. The still goes through :func:`first_frame_scaled` instead.
    The first ``ANMF`` chunk's ``ALPH`` (if any) and ``VP8 `` or ``VP8L`` chunks are wrapped in a
    file of their own (WebP container spec, "Extended File Format"), with a ``VP8X`` saying alpha
    when there is an ``ALPH``.

    Returns:
        The still and its box, or None: not an animation, a frame outside the canvas, or chunks
        this cannot follow (then Pillow decodes the animation).
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunks = _chunks(data, 12, len(data))
    header = next(((s, e) for tag, s, e in chunks if tag == b"VP8X"), None)
    frame = next(((s, e) for tag, s, e in chunks if tag == b"ANMF"), None)
    if header is None or frame is None or header[1] - header[0] < 10 or frame[1] - frame[0] < 16:
        return None
    canvas = data[header[0] + 4 : header[0] + 10]
    (canvas_width, canvas_height), (x, y, width, height) = (
        (_u24(canvas, 0) + 1, _u24(canvas, 3) + 1),
        tuple(_u24(data, frame[0] + at) * 2 for at in (0, 3)) + tuple(_u24(data, frame[0] + at) + 1 for at in (6, 9)),
    )
    if x + width > canvas_width or y + height > canvas_height:  # libwebp's demuxer refuses it: Pillow says so
        return None
    parts = {tag: data[s:e] for tag, s, e in _chunks(data, frame[0] + 16, frame[1])}
    bitstream = next((tag for tag in (b"VP8 ", b"VP8L") if tag in parts), None)
    if bitstream is None:
        return None
    if b"ALPH" in parts and bitstream == b"VP8 ":  # lossy with an alpha plane: the extended format
        extended = _chunk(b"VP8X", b"\x10\0\0\0" + data[frame[0] + 6 : frame[0] + 12])
        body = extended + _chunk(b"ALPH", parts[b"ALPH"]) + _chunk(b"VP8 ", parts[b"VP8 "])
    else:  # the simple format: VP8L carries its own alpha
        body = _chunk(bitstream, parts[bitstream])
    return FirstFrame(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body, (x, y, width, height))


def _u24(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 3], "little")


def first_frame_scaled(data: bytes, size: tuple[int, int], target: tuple[int, int], alpha: bool) -> Image.Image | None:
    """An animated WebP's first frame on its canvas, decoded by libwebp's rescaler as
    :func:`webp_scaled` decodes a still: the frame alone, scaled, on a canvas of the scaled size,
    transparent (``alpha``) or black around it, as libwebp's animation decoder draws it. None
    when :func:`first_frame` or the scaling gives none (then Pillow decodes the animation).

    Pillow's animation decoder holds three full canvases: a 140-byte file of a 2x2 first frame on
    a 6324x6324 canvas took +699 MiB at peak, 16 of them 10 s of CPU.
    """
    frame, scaled = first_frame(data), _scaled_size(size, target)
    if frame is None or scaled is None:
        return None
    x, y, width, height = frame.box
    if (x, y, width, height) == (0, 0, *size):
        return _decode_to(frame.still, size, scaled, alpha)
    sx, sy = scaled[0] / size[0], scaled[1] / size[1]
    inner = (max(1, round(width * sx)), max(1, round(height * sy)))
    picture = _decode_to(frame.still, (width, height), inner, alpha)
    if picture is None:
        return None
    canvas = Image.new("RGBA" if alpha else "RGB", scaled, (0, 0, 0, 0) if alpha else (0, 0, 0))
    canvas.paste(picture, (min(round(x * sx), scaled[0] - inner[0]), min(round(y * sy), scaled[1] - inner[1])))
    return canvas
