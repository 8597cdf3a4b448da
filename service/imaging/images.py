"""Decoding uploaded image files with Pillow: displayed orientation, the model's colour mode, limits.

What a client sends is untrusted. :func:`decode_image` accepts only the formats in
:data:`ACCEPTED_FORMATS` (Pillow's other plugins, EPS through Ghostscript among them, are
never tried), pre-scans a JPEG's segments and a PNG's chunks before Pillow parses them
(:mod:`service.imaging.prescan`: scan, segment, chunk, fill-byte and metadata bombs), checks the pixel
count from the header before any pixel is decoded, and turns
every failure into a 4xx problem: 413 for an image too large, 415 for a truncated, corrupt or
unaccepted file (naming the format and the fault), never an unexpected exception.

Decoding runs in a thread pool, never on the event loop (Pillow releases the GIL while it
decodes). Turning the decoded image into model input is :mod:`service.imaging.preprocess`.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, PngImagePlugin, UnidentifiedImageError

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.imaging.prescan import PrescanLimits, prescan

try:
    import webp  # libwebp's decode API through cffi (the webp package): scaled WebP decoding
except ImportError:  # without it, Pillow decodes every WebP at full size
    webp = None
# libwebp's WebPDecoderOptions (src/webp/decode.h) is 14 ints and 5 uint32 of padding; the webp
# package declares only use_threads, its 11th int. use_scaling, scaled_width and scaled_height
# are the 8th to 10th: written by index, once the package's layout is the one decode.h gives.
_SCALING = 7
_WEBP_SCALES = webp is not None and (
    webp.ffi.offsetof("WebPDecoderOptions", "use_threads") == 40 and webp.ffi.sizeof("WebPDecoderOptions") == 76
)

log = logging.getLogger(__name__)

# Pillow re-checks sizes it learns while decoding (an ICO's embedded PNG or BMP, a WebP
# canvas, a GIF frame beyond the screen, a TIFF tile) against Image.MAX_IMAGE_PIXELS: it warns
# above it and raises DecompressionBombError above twice it. decode_image sets it to half its
# own limit so those nested checks raise exactly where ours does (413); the warnings between
# the two are noise, since the header check below has already decided.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def _register_heif() -> bool:
    """Register pillow-heif's HEIF/HEIC opener if the optional ``heic`` extra is installed."""
    try:
        import pillow_heif
    except ImportError:
        return False
    pillow_heif.register_heif_opener()
    return True


HEIF_AVAILABLE = _register_heif()

# Pillow format ids tried, in order. MPO (multi-picture JPEG) is opened by the JPEG plugin.
ACCEPTED_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP", "ICO", "AVIF") + (
    ("HEIF",) if HEIF_AVAILABLE else ()
)
ACCEPTED_NAMES = "JPEG (MPO), PNG, GIF, WebP, TIFF, BMP, ICO, AVIF" + (", HEIC/HEIF" if HEIF_AVAILABLE else "")

# Leading bytes of formats worth naming in a 415: (offset, signature, name).
_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"BM", "BMP"),
    (0, b"\x00\x00\x01\x00", "ICO"),
    (0, b"%PDF", "PDF"),
    (0, b"%!PS", "PostScript/EPS"),
    (0, b"\xc5\xd0\xd3\xc6", "EPS"),
    (0, b"8BPS", "Photoshop (PSD)"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
    (0, b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"qoif", "QOI"),
    (0, b"DDS ", "DDS"),
    (0, b"icns", "ICNS"),
    (0, b"\x00\x00\x02\x00", "CUR"),
    (0, b"PK\x03\x04", "ZIP"),
    (0, b"\x1f\x8b", "gzip"),
)
_NAMES = {"WEBP": "WebP", "HEIF": "HEIC/HEIF"}  # Pillow's format ids as messages name them
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"}
_AVIF_BRANDS = {b"avif", b"avis"}

# EXIF orientation (tag 0x0112) -> the transposition that displays the stored pixels, as
# ImageOps.exif_transpose applies it. 5-8 turn by 90 degrees: width and height swap.
_DISPLAY_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}
# Pillow's PNG plugin: a chunk inflating past MAX_TEXT_CHUNK, or text past MAX_TEXT_MEMORY.
_PNG_METADATA_ERRORS = ("Decompressed data too large", "Too much memory used in text chunks")
_HIGH_DEPTH_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I", "F"}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


@dataclass(frozen=True)
class DecodedImage:
    """An uploaded image as the client displays it.

    Attributes:
        image: Pillow image in the requested colour mode, EXIF orientation applied. A JPEG may
            have been DCT-downscaled while decoding (draft mode), so ``image.size`` can be
            smaller than (width, height). None once the request path has preprocessed it and
            dropped it (only ``render=png`` keeps it: a full-size picture is large).
        width: displayed width of the full-resolution image, in pixels.
        height: displayed height of the full-resolution image, in pixels.
        format: Pillow's format name ("JPEG", "MPO", "PNG", "HEIF", ...).
        size: (width, height) of ``image`` in pixels, as decoded (kept when the image is dropped).
    """

    image: Image.Image | None
    width: int
    height: int
    format: str
    size: tuple[int, int] = (0, 0)

    def dropped(self) -> DecodedImage:
        """The same record without the picture, so that its pixels can be freed."""
        return dataclasses.replace(self, image=None)


def sniff_format(data: bytes) -> str | None:
    """Name the file format from its leading bytes (None when unknown); used in 415 details."""
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in _HEIF_BRANDS:
            return "HEIC/HEIF"
        if brand in _AVIF_BRANDS:
            return "AVIF"
        return "ISO media (MP4/QuickTime)"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    for offset, signature, name in _SIGNATURES:
        if data[offset : offset + len(signature)] == signature:
            return name
    head = data[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")) or b"<svg" in head:
        return "SVG/XML"
    if head.startswith((b"<!doctype html", b"<html")):
        return "HTML"
    return None


def _unidentified(data: bytes) -> InvalidImage:
    name = sniff_format(data)
    if name == "HEIC/HEIF" and not HEIF_AVAILABLE:
        return InvalidImage(
            "HEIC/HEIF images need the optional HEIF decoder, which this server does not have "
            "(install patchserve[heic], i.e. pillow-heif); send JPEG or PNG instead"
        )
    accepted = {f.upper() for f in ACCEPTED_FORMATS} | ({"HEIC/HEIF"} if HEIF_AVAILABLE else set())
    if name is not None and name.upper() in accepted:  # the whole name: "JPEG XL" and "JPEG 2000" are not JPEG
        return InvalidImage(f"the {name} image is corrupt: its header cannot be read")
    if name is not None:
        return InvalidImage(f"{name} files are not accepted; send one of {ACCEPTED_NAMES}")
    return InvalidImage(f"the data is not an image in a format this server decodes ({ACCEPTED_NAMES})")


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8); 1 when absent, out of range or unreadable."""
    try:
        value = image.getexif().get(0x0112, 1)
    except Exception:  # a malformed EXIF block must not lose an otherwise good photo
        log.debug("unreadable EXIF ignored", exc_info=True)
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit single-channel modes -> "L" (or "LA" with a tRNS key), rescaled.

    Pillow's own ``convert("L")`` clips these (every value above 255 turns white). Here
    integer modes are read as 16-bit (0-65535) and divided by 257 with rounding, so 65535 -> 255
    and 32768 -> 128; float ("F") images are read as 0.0-1.0.
    """
    pixels = np.asarray(image)  # (H, W) uint16 / int32 / float32
    if image.mode == "F":
        scaled = np.clip(np.nan_to_num(pixels, nan=0.0), 0.0, 1.0) * 255.0
    else:
        scaled = np.clip(pixels, 0, 65535).astype(np.float32) / 257.0
    gray = Image.fromarray(np.rint(scaled).astype(np.uint8))
    key = image.info.get("transparency")
    if isinstance(key, int) and image.mode != "F":
        alpha = Image.fromarray(np.where(pixels == key, 0, 255).astype(np.uint8))
        return Image.merge("LA", (gray, alpha))
    return gray


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in _ALPHA_MODES or (image.mode in ("P", "L", "RGB") and "transparency" in image.info)


def _to_mode(image: Image.Image, color_mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Any Pillow mode -> ``color_mode`` ("L" or "RGB"), alpha composited onto ``background``."""
    if image.mode in _HIGH_DEPTH_MODES:
        image = _to_8bit(image)
    if _has_transparency(image):
        if image.mode == "La":
            image = image.convert("LA")
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba).convert("RGB")
    if image.mode not in ("L", "RGB") and color_mode == "L":
        image = image.convert("RGB")  # CMYK, YCbCr, ... reach L through RGB
    return image.convert(color_mode) if image.mode != color_mode else image


def _webp_scaled(data: bytes, size: tuple[int, int], target: tuple[int, int], alpha: bool) -> Image.Image | None:
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
        An "RGB" or "RGBA" image, or None when scaling would not shrink it, or libwebp cannot
        decode the file this way (then Pillow decodes it, and reports any fault).
    """
    if not _WEBP_SCALES:
        return None
    width, height = size
    scale = min(1.0, 2 * max(target[0] / width, target[1] / height))
    scaled = (max(1, min(width, math.ceil(width * scale))), max(1, min(height, math.ceil(height * scale))))
    if scaled[0] * scaled[1] * 2 > width * height:
        return None  # not worth a second path: Pillow decodes it
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
    source = webp.ffi.from_buffer(data)
    status = webp.lib.WebPDecode(webp.ffi.cast("uint8_t*", source), len(data), config.ptr)
    webp.lib.WebPFreeDecBuffer(webp.ffi.addressof(config.ptr, "output"))
    if status != webp.lib.VP8_STATUS_OK:
        return None
    return Image.fromarray(pixels, "RGBA" if alpha else "RGB")


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width < 1 or height < 1:
        raise InvalidImage(f"the image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise PayloadTooLarge(f"the image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}")


def decode_image(
    data: bytes,
    *,
    color_mode: str,
    max_pixels: int,
    draft_size: tuple[int, int] | None = None,
    background: tuple[int, int, int] = (255, 255, 255),
    limits: PrescanLimits | None = None,
) -> DecodedImage:
    """Decode an image file into the displayed orientation and ``color_mode``.

    Accepts :data:`ACCEPTED_FORMATS`; an animated GIF, WebP, AVIF or multi-page TIFF/MPO gives
    its first frame. The EXIF orientation (1-8, EXIF 2.32 tag 0x0112) is applied, so pixels and
    the reported size are those of the image as displayed. CMYK and YCCK become RGB; 16-bit
    images are rescaled to 8 bits; alpha and palette or colour-key transparency are composited
    onto ``background``; 1-bit becomes 0/255. A HEIF's orientation is its irot/imir boxes,
    which libheif applies while decoding (the HEIF spec makes its EXIF orientation informative
    only; pillow-heif resets that to 1), and Pillow 12+ turns a TIFF upright while loading.

    :func:`open_image` then :meth:`OpenedImage.decode`: the request path runs the two apart,
    reserving the pixels the header declares in between, so each file is pre-scanned and its
    header parsed once.

    Args:
        data: the file's bytes.
        color_mode: Pillow mode the model wants, "L" or "RGB".
        max_pixels: largest width x height accepted, checked from the header before decoding.
        draft_size: (width, height) in displayed orientation the caller will resize to; a JPEG
            is then decoded at the smallest DCT scale (1/2, 1/4, 1/8) still at least that big,
            and a still WebP by libwebp's rescaler to about twice that (:func:`_webp_scaled`).
        background: (R, G, B) 0-255 under transparent pixels.
        limits: the structure and metadata limits of :func:`service.imaging.prescan.prescan`
            (default :class:`PrescanLimits`' defaults). An ICC profile or text chunk up to
            ``limits.max_metadata_bytes`` is read (the profile is not applied: pixels are taken
            as sRGB, as the models were trained on them).

    Returns:
        The decoded image with its displayed full-resolution size.

    Raises:
        BadRequest: empty data (400).
        InvalidImage: an unaccepted, unknown, corrupt or truncated file (415); the detail names
            the format and the fault.
        PayloadTooLarge: more than ``max_pixels`` pixels, decompression bombs included, or
            a structure or metadata bomb the pre-scan refuses (413).
    """
    opened = open_image(data, color_mode=color_mode, max_pixels=max_pixels, draft_size=draft_size, limits=limits)
    return opened.decode(background)


def decoded_pixels(
    data: bytes,
    *,
    color_mode: str,
    max_pixels: int,
    draft_size: tuple[int, int] | None = None,
    limits: PrescanLimits | None = None,
) -> int:
    """How many pixels :func:`decode_image` will decode ``data`` to: :func:`open_image`'s ``pixels``.

    Raises:
        BadRequest, InvalidImage, PayloadTooLarge: as :func:`open_image`.
    """
    return open_image(data, color_mode=color_mode, max_pixels=max_pixels, draft_size=draft_size, limits=limits).pixels


@dataclass
class OpenedImage:
    """A file whose pre-scan passed and whose header Pillow has parsed; no pixel decoded yet.

    Attributes:
        pixels: width x height that decoding will hold, read from the header: a baseline
            JPEG counts its DCT-downscaled (draft) size; a progressive one, and a WebP, their
            full size (libjpeg holds every coefficient of a progressive image, libwebp its
            full-size plane even when it scales).
        width, height: the displayed full-resolution size (EXIF orientation applied), pixels;
            for a PNG whose EXIF follows its pixels, the stored size until decoded (the
            :class:`DecodedImage` has the displayed one).
        format: Pillow's format name.
    """

    pixels: int
    width: int
    height: int
    format: str
    _data: bytes
    _image: Image.Image | None  # None once decoded: the loaded full-size pixels are not kept here
    _name: str
    _orientation: int | None  # None: a PNG whose EXIF (if any) follows its pixels, read once loaded
    _color_mode: str
    _max_pixels: int
    _draft_size: tuple[int, int] | None
    _limits: PrescanLimits

    def decode(self, background: tuple[int, int, int] = (255, 255, 255)) -> DecodedImage:
        """Decode the pixels, as :func:`decode_image` (once: the header's file is consumed).

        Raises:
            InvalidImage, PayloadTooLarge: as :func:`decode_image`, for what decoding finds.
        """
        image, orientation, (width, height) = self._image, self._orientation, (self.width, self.height)
        if image is None:
            raise RuntimeError("this OpenedImage was decoded already")
        self._image = None
        with _FileFaults(self._data, self._name, self._max_pixels, self._limits):
            transposed = orientation in _TRANSPOSED_ORIENTATIONS  # None (a PNG): no draft, no scaling
            scaled = None
            if self._draft_size is not None and self.format == "WEBP" and getattr(image, "n_frames", 1) == 1:
                stored_target = (self._draft_size[1], self._draft_size[0]) if transposed else self._draft_size
                scaled = _webp_scaled(self._data, image.size, stored_target, alpha=image.mode == "RGBA")
            if scaled is not None:
                image = scaled
            else:
                image.load()
                if image.size[0] * image.size[1] > self._max_pixels:  # a plugin that learnt its size while loading
                    _check_pixels(*image.size, self._max_pixels)
                if orientation is None:  # now loaded, Pillow has the chunks after the pixels too
                    orientation = _orientation(image)
                    if orientation in _TRANSPOSED_ORIENTATIONS:
                        width, height = height, width
                elif orientation != 1 and _orientation(image) == 1:
                    # The plugin applied the orientation itself while loading (Pillow 12+ does for TIFF)
                    # and dropped the tag: the loaded image is as displayed (no draft outside JPEG).
                    orientation, (width, height) = 1, image.size
            image = _to_mode(image, self._color_mode, background)
            if orientation in _DISPLAY_TRANSPOSE:
                image = image.transpose(_DISPLAY_TRANSPOSE[orientation])
        return DecodedImage(image=image, width=width, height=height, format=self.format, size=image.size)


def open_image(
    data: bytes,
    *,
    color_mode: str,
    max_pixels: int,
    draft_size: tuple[int, int] | None = None,
    limits: PrescanLimits | None = None,
) -> OpenedImage:
    """Pre-scan ``data`` and parse its header: what decoding it will cost, before any pixel is decoded.

    Args:
        data, color_mode, max_pixels, draft_size, limits: as :func:`decode_image`.

    Returns:
        The opened file; :meth:`OpenedImage.decode` decodes it.

    Raises:
        BadRequest, InvalidImage, PayloadTooLarge: as :func:`decode_image`, for what the header
            and pre-scan show.
    """
    if not data:
        raise BadRequest("the image is empty (0 bytes)")
    limits = limits or PrescanLimits()
    prescan(data, limits)  # before Pillow parses a byte of it
    # Pillow's PNG plugin refuses an ICC profile or text chunk inflating past MAX_TEXT_CHUNK
    # (1 MiB by default, so a valid 2 MB profile was "corrupt"): ours is the metadata limit.
    PngImagePlugin.MAX_TEXT_CHUNK = PngImagePlugin.MAX_TEXT_MEMORY = limits.max_metadata_bytes
    # The backstop for Pillow's nested checks (see the top of this module): it raises above
    # 2 * MAX_IMAGE_PIXELS >= max_pixels. A process serves one limit, so this never flips.
    Image.MAX_IMAGE_PIXELS = (max_pixels + 1) // 2
    faults = _FileFaults(data, sniff_format(data) or "image", max_pixels, limits)  # names the format in messages
    with faults:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
        fmt = image.format or "unknown"
        faults.name = _NAMES.get(fmt, fmt)
        stored_w, stored_h = image.size
        _check_pixels(stored_w, stored_h, max_pixels)
        # Pillow finds a PNG's eXIf chunk after the pixels by decoding them all (getexif loads):
        # the header's count must not cost a decode, so such a PNG's orientation waits for
        # decode() (a PNG has no draft size, and its pixel count is the same either way).
        orientation = None if fmt == "PNG" and "exif" not in image.info else _orientation(image)
        transposed = orientation in _TRANSPOSED_ORIENTATIONS
        width, height = (stored_h, stored_w) if transposed else (stored_w, stored_h)
        if draft_size is not None and fmt in ("JPEG", "MPO"):
            stored_target = (draft_size[1], draft_size[0]) if transposed else draft_size
            image.draft("RGB" if color_mode == "RGB" else "L", stored_target)
        full = fmt == "WEBP" or (fmt in ("JPEG", "MPO") and bool(image.info.get("progressive")))
        pixels = stored_w * stored_h if full else image.size[0] * image.size[1]
    return OpenedImage(
        pixels=pixels,
        width=width,
        height=height,
        format=fmt,
        _data=data,
        _image=image,
        _name=faults.name,
        _orientation=orientation,
        _color_mode=color_mode,
        _max_pixels=max_pixels,
        _draft_size=draft_size,
        _limits=limits,
    )


class _FileFaults:
    """Turns whatever Pillow or a plugin raises on a file into the file's 4xx: one mapping for
    :func:`open_image` and :meth:`OpenedImage.decode`. ``name`` (the format's, for messages)
    may be updated inside the block once Pillow has identified the file."""

    def __init__(self, data: bytes, name: str, max_pixels: int, limits: PrescanLimits) -> None:
        self.data, self.name, self.max_pixels, self.limits = data, name, max_pixels, limits

    def __enter__(self) -> _FileFaults:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, (BadRequest, InvalidImage, PayloadTooLarge)):
            return False
        if not isinstance(exc, Exception):  # KeyboardInterrupt, cancellation: not the file's fault
            return False
        raise self._mapped(exc) from None

    def _mapped(self, exc: Exception) -> Exception:
        name = self.name
        if isinstance(exc, Image.DecompressionBombError):
            found = re.search(r"\((\d+) pixels\)", str(exc))
            pixels = f"{found.group(1)} pixels" if found else "more pixels than that"
            return PayloadTooLarge(
                f"the {name} image declares {pixels}; the limit is {self.max_pixels} (a decompression bomb?)"
            )
        if isinstance(exc, ValueError):
            if not str(exc).startswith(_PNG_METADATA_ERRORS):
                log.debug("decoding failed", exc_info=exc)
                return InvalidImage(f"the {name} image is corrupt (ValueError: {exc})")
            return PayloadTooLarge(
                f"the {name} image's metadata (an ICC profile or text) inflates to more than "
                f"{self.limits.max_metadata_bytes} bytes, the limit (PATCHSERVE_MAX_IMAGE_METADATA_BYTES)"
            )
        if isinstance(exc, MemoryError):
            return PayloadTooLarge(f"decoding the {name} image needs more memory than this server has")
        if isinstance(exc, UnidentifiedImageError):
            return _unidentified(self.data)
        if isinstance(exc, (OSError, EOFError, SyntaxError)):
            fault = "truncated" if "truncated" in str(exc) or isinstance(exc, EOFError) else "corrupt"
            return InvalidImage(f"the {name} image is {fault}: {exc}")
        # whatever a crafted file makes a decoder raise is still the file's fault
        log.debug("decoding failed", exc_info=exc)
        return InvalidImage(f"the {name} image is corrupt ({type(exc).__name__}: {exc})")
