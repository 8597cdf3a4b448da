"""The input formats: which files are decoded, how a refused one is named, and each file's faults as 4xx.

:data:`ACCEPTED_FORMATS` are the Pillow plugins tried, in order (Pillow's others, EPS through
Ghostscript among them, are never tried); :func:`sniff_format` names a file from its leading
bytes for a 415's detail; :class:`FileFaults` maps whatever Pillow or a plugin raises on a file
to its 413 or 415. Adding a format is docs/STYLE.md's "How to add an input format".
"""

from __future__ import annotations

import logging
import re
from typing import Literal

from PIL import Image, UnidentifiedImageError

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.imaging.prescan_limits import PrescanLimits

log = logging.getLogger(__name__)


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
    (0, b"PK\x03\x04", "ZIP"),
    (0, b"\x1f\x8b", "gzip"),
)
_TGA_FOOTER = b"TRUEVISION-XFILE.\x00"
FORMAT_NAMES = {"WEBP": "WebP", "HEIF": "HEIC/HEIF"}  # Pillow's format ids as messages name them
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"}
_AVIF_BRANDS = {b"avif", b"avis"}
# Pillow's PNG plugin: a chunk inflating past MAX_TEXT_CHUNK, or text past MAX_TEXT_MEMORY.
_PNG_METADATA_ERRORS = ("Decompressed data too large", "Too much memory used in text chunks")


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
    if data.endswith(_TGA_FOOTER):  # TGA has no leading signature; version 2 files end with this
        return "TGA"
    # A CUR starts 00 00 02 00 and a count of at least one image; so does an uncompressed TGA
    # without an id or colour map (id length 0, no map, type 2), whose next bytes are zero.
    if data[:4] == b"\x00\x00\x02\x00" and len(data) >= 6 and data[4:6] != b"\x00\x00":
        return "CUR"
    head = data[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")) or b"<svg" in head:
        return "SVG/XML"
    if head.startswith((b"<!doctype html", b"<html")):
        return "HTML"
    return None


def unidentified(data: bytes) -> InvalidImage:
    """The 415 of data Pillow could not identify: the format's name when its signature is there."""
    if data == b"\xff\xd8":  # SOI and no more: a JPEG cut short before its signature's third byte
        return InvalidImage("the JPEG image is truncated: the data ends after its start-of-image marker")
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


class FileFaults:
    """Turns whatever Pillow or a plugin raises on a file into the file's 4xx: one mapping for
    :func:`open_image` and :meth:`OpenedImage.decode`. ``name`` (the format's, for messages)
    may be updated inside the block once Pillow has identified the file."""

    def __init__(self, data: bytes, name: str, max_pixels: int, limits: PrescanLimits) -> None:
        self.data, self.name, self.max_pixels, self.limits = data, name, max_pixels, limits

    def __enter__(self) -> FileFaults:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
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
            return unidentified(self.data)
        if isinstance(exc, (OSError, EOFError, SyntaxError)):
            # "image file is truncated", "Truncated File Read" (a header cut short), "truncated PNG file"
            fault = "truncated" if "truncated" in str(exc).lower() or isinstance(exc, EOFError) else "corrupt"
            return InvalidImage(f"the {name} image is {fault}: {exc}")
        # whatever a crafted file makes a decoder raise is still the file's fault
        log.debug("decoding failed", exc_info=exc)
        return InvalidImage(f"the {name} image is corrupt ({type(exc).__name__}: {exc})")
