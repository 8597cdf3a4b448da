"""Decoding uploaded image files with Pillow: displayed orientation, the model's colour mode, limits.

What a client sends is untrusted. :func:`decode_image` accepts only the formats in
:data:`~service.imaging.formats.ACCEPTED_FORMATS` (Pillow's other plugins, EPS through Ghostscript
among them, are never tried), pre-scans a JPEG's segments and a PNG's chunks before Pillow parses them
(:mod:`service.imaging.prescan`: scan, segment, chunk, fill-byte and metadata bombs), checks the pixel
count from the header before any pixel is decoded, and turns
every failure into a 4xx problem: 413 for an image too large, 415 for a truncated, corrupt or
unaccepted file (naming the format and the fault), never an unexpected exception.

Decoding runs in a thread pool, never on the event loop (Pillow releases the GIL while it
decodes). Turning the decoded image into model input is :mod:`service.imaging.preprocess`.
Which formats, and what each file's faults become, is :mod:`service.imaging.formats`; the
orientation and colour modes :mod:`service.imaging.modes`; a WebP's scaled decode
:mod:`service.imaging.webp_scaled`.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import warnings
from dataclasses import dataclass

from PIL import Image, PngImagePlugin, TiffImagePlugin

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.imaging import modes
from service.imaging.formats import ACCEPTED_FORMATS, FORMAT_NAMES, FileFaults, sniff_format
from service.imaging.modes import DISPLAY_TRANSPOSE, TRANSPOSED_ORIENTATIONS
from service.imaging.prescan import prescan
from service.imaging.prescan_limits import PrescanLimits
from service.imaging.render import displayed_canvas
from service.imaging.webp_scaled import first_frame_scaled, webp_scaled

log = logging.getLogger(__name__)

# Pillow re-checks sizes it learns while decoding (an ICO's embedded PNG or BMP, a WebP
# canvas, a GIF frame beyond the screen, a TIFF tile) against Image.MAX_IMAGE_PIXELS: it warns
# above it and raises DecompressionBombError above twice it. decode_image sets it to half its
# own limit so those nested checks raise exactly where ours does (413); the warnings between
# the two are noise, since the header check below has already decided.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
# What a line of an image (a row or a column) costs beyond its pixels while it is decoded and
# preprocessed, in pixels' worth (:attr:`OpenedImage.cost`): Pillow keeps a pointer a row, and the
# resize's passes lines of their own. A 1x40,000,000 PNG strip held +610 MiB for its 40 MP (a fresh
# user's find); one-pixel-wide strips measured 17-25 bytes a row through the committed models'
# preprocessing (8-bit grey, where a pixel is a byte). 32 bounds them, and adds 0.2 % to a 4000x3000 photo.
LINE_PIXELS = 32


@dataclass(frozen=True)
class DecodedImage:
    """An uploaded image as the client displays it.

    Attributes:
        image: Pillow image in the requested colour mode, EXIF orientation applied. A JPEG may
            have been DCT-downscaled while decoding (draft mode), so ``image.size`` can be
            smaller than (width, height). None once the request path has preprocessed it and
            dropped it (only ``render=png`` keeps it, scaled to its picture: :meth:`for_picture`).
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

    def for_picture(self) -> DecodedImage:
        """The same record with its picture as ``render=png`` draws on it, and no more.

        RGB, at the displayed size scaled down to at most ``MAX_PICTURE_PIXELS``
        (:func:`service.imaging.render.displayed_canvas`): what a request keeps while its
        picture waits to be drawn, after its pixels left the worker's decoding budget.
        """
        assert self.image is not None
        return dataclasses.replace(self, image=displayed_canvas(self.image, (self.width, self.height)))


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
            and a still WebP (or an animated one's first frame) by libwebp's rescaler to about
            twice that (:func:`~service.imaging.webp_scaled.webp_scaled`).
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
            JPEG of one scan counts its DCT-downscaled (draft) size; one of several scans
            (progressive, or a scan per component), and a WebP, their full size (libjpeg holds
            every coefficient of such an image, libwebp its full-size plane even when it scales).
        lines: rows + columns of that size (:attr:`cost`).
        width, height: the displayed full-resolution size (EXIF orientation applied), pixels;
            for a PNG whose EXIF follows its pixels, the stored size until decoded (the
            :class:`DecodedImage` has the displayed one).
        format: Pillow's format name.
    """

    pixels: int
    width: int
    height: int
    format: str
    lines: int
    _data: bytes
    _image: Image.Image | None  # None once decoded: the loaded full-size pixels are not kept here
    _name: str
    _orientation: int | None  # None: a PNG whose EXIF (if any) follows its pixels, read once loaded
    _color_mode: str
    _max_pixels: int
    _draft_size: tuple[int, int] | None
    _limits: PrescanLimits

    @property
    def cost(self) -> int:
        """What decoding and preprocessing it hold, in pixels' worth: ``pixels + LINE_PIXELS * lines``.

        What the worker's decoding budget, the request's pixel total and the lone path count.
        """
        return self.pixels + LINE_PIXELS * self.lines

    def decode(self, background: tuple[int, int, int] = (255, 255, 255)) -> DecodedImage:
        """Decode the pixels, as :func:`decode_image` (once: the header's file is consumed).

        Raises:
            InvalidImage, PayloadTooLarge: as :func:`decode_image`, for what decoding finds.
        """
        image, orientation, (width, height) = self._image, self._orientation, (self.width, self.height)
        if image is None:
            raise RuntimeError("this OpenedImage was decoded already")
        self._image = None
        with FileFaults(self._data, self._name, self._max_pixels, self._limits):
            transposed = orientation in TRANSPOSED_ORIENTATIONS  # None (a PNG): no draft, no scaling
            scaled = None
            if self._draft_size is not None and self.format == "WEBP":  # an animation: its first frame
                stored_target = (self._draft_size[1], self._draft_size[0]) if transposed else self._draft_size
                scale = webp_scaled if getattr(image, "n_frames", 1) == 1 else first_frame_scaled
                scaled = scale(self._data, image.size, stored_target, alpha=image.mode == "RGBA")
            if scaled is not None:
                image = scaled
            else:
                image.load()
                if image.size[0] * image.size[1] > self._max_pixels:  # a plugin that learnt its size while loading
                    _check_pixels(*image.size, self._max_pixels)
                if orientation is None:  # now loaded, Pillow has the chunks after the pixels too
                    orientation = modes.orientation(image, self._limits.max_tiff_tags)
                    if orientation in TRANSPOSED_ORIENTATIONS:
                        width, height = height, width
                elif orientation != 1 and modes.orientation(image, self._limits.max_tiff_tags) == 1:
                    # The plugin applied the orientation itself while loading (Pillow 12+ does for TIFF)
                    # and dropped the tag: the loaded image is as displayed (no draft outside JPEG).
                    orientation, (width, height) = 1, image.size
            image = modes.to_mode(image, self._color_mode, background)
            if orientation in DISPLAY_TRANSPOSE:
                image = image.transpose(DISPLAY_TRANSPOSE[orientation])
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
    scanned = prescan(data, limits)  # before Pillow parses a byte of it
    # Pillow's PNG plugin refuses an ICC profile or text chunk inflating past MAX_TEXT_CHUNK
    # (1 MiB by default, so a valid 2 MB profile was "corrupt"): ours is the metadata limit.
    PngImagePlugin.MAX_TEXT_CHUNK = PngImagePlugin.MAX_TEXT_MEMORY = limits.max_metadata_bytes
    # An uncompressed TIFF read by libtiff, as a compressed one is, not by Pillow's raw decoder,
    # which reads strips in Python and re-reads overlapping or surplus ones (two strips one byte
    # apart: 5.5 s for 19 MiB); and a JPEG-in-TIFF strip's scans capped as a JPEG's are
    # (libtiff's own default is 100; service/imaging/prescan_tiff.py).
    TiffImagePlugin.READ_LIBTIFF = True
    os.environ["LIBTIFF_JPEG_MAX_ALLOWED_SCAN_NUMBER"] = str(limits.max_jpeg_scans)
    # The backstop for Pillow's nested checks (see the top of this module): it raises above
    # 2 * MAX_IMAGE_PIXELS >= max_pixels. A process serves one limit, so this never flips.
    Image.MAX_IMAGE_PIXELS = (max_pixels + 1) // 2
    faults = FileFaults(data, sniff_format(data) or "image", max_pixels, limits)  # names the format in messages
    with faults:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
        fmt = image.format or "unknown"
        faults.name = FORMAT_NAMES.get(fmt, fmt)
        stored_w, stored_h = image.size
        _check_pixels(stored_w, stored_h, max_pixels)
        modes.check_depth(image, faults.name)
        modes.rescale_grey_key(image)
        # Pillow finds a PNG's eXIf chunk after the pixels by decoding them all (getexif loads):
        # the header's count must not cost a decode, so such a PNG's orientation waits for
        # decode() (a PNG has no draft size, and its pixel count is the same either way).
        orientation = (
            None if fmt == "PNG" and "exif" not in image.info else modes.orientation(image, limits.max_tiff_tags)
        )
        transposed = orientation in TRANSPOSED_ORIENTATIONS
        width, height = (stored_h, stored_w) if transposed else (stored_w, stored_h)
        if draft_size is not None and fmt in ("JPEG", "MPO") and not scanned.lossless:  # libjpeg cannot scale it
            stored_target = (draft_size[1], draft_size[0]) if transposed else draft_size
            image.draft("RGB" if color_mode == "RGB" else "L", stored_target)
        # A non-interleaved baseline JPEG (a scan per component) is held whole too: counted at its
        # draft size, 6324x6324 of them reserved 625,681 pixels and held 40 million (a reviewer's find).
        full = fmt == "WEBP" or (fmt in ("JPEG", "MPO") and (bool(image.info.get("progressive")) or scanned.multi_scan))
        held_w, held_h = (stored_w, stored_h) if full else image.size
    return OpenedImage(
        pixels=held_w * held_h,
        width=width,
        height=height,
        format=fmt,
        lines=held_w + held_h,
        _data=data,
        _image=image,
        _name=faults.name,
        _orientation=orientation,
        _color_mode=color_mode,
        _max_pixels=max_pixels,
        _draft_size=draft_size,
        _limits=limits,
    )
