"""Decoding uploaded image files with Pillow: displayed orientation, the model's colour mode, limits.

Decoding runs in a thread pool, never on the event loop (Pillow releases the GIL while it
decodes). Turning the decoded image into model input is :mod:`service.preprocess`.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from service.errors import InvalidImage, PayloadTooLarge

# Pillow's own bomb check would warn at 89 Mpx and raise at twice that; we check the header
# against our own limit before decoding instead, and turn Pillow's warning into an error.
Image.MAX_IMAGE_PIXELS = None

# EXIF orientations 5-8 rotate by 90 degrees: the displayed image swaps width and height.
_TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}


@dataclass(frozen=True)
class DecodedImage:
    """An uploaded image as the client displays it.

    Attributes:
        image: Pillow image in the requested colour mode, EXIF orientation applied. A JPEG may
            have been DCT-downscaled while decoding (draft mode), so ``image.size`` can be
            smaller than (width, height).
        width: displayed width of the full-resolution image, in pixels.
        height: displayed height of the full-resolution image, in pixels.
        format: Pillow's format name ("JPEG", "PNG", ...).
    """

    image: Image.Image
    width: int
    height: int
    format: str


def decode_image(
    data: bytes, *, color_mode: str, max_pixels: int, draft_size: tuple[int, int] | None = None
) -> DecodedImage:
    """Decode an image file into the displayed orientation and ``color_mode``.

    Args:
        data: the file's bytes.
        color_mode: Pillow mode the model wants, "L" or "RGB".
        max_pixels: largest width x height accepted, checked from the header before decoding.
        draft_size: (width, height) in displayed orientation the caller will resize to; a JPEG
            is then decoded at the smallest DCT scale (1/2, 1/4, 1/8) still at least that big.

    Returns:
        The decoded image with its displayed full-resolution size.

    Raises:
        InvalidImage: empty, unknown, corrupt or truncated data (415).
        PayloadTooLarge: more than ``max_pixels`` pixels, decompression bombs included (413).
    """
    if not data:
        raise InvalidImage("the image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            stored_w, stored_h = image.size
            if stored_w * stored_h > max_pixels:
                raise PayloadTooLarge(
                    f"the image is {stored_w}x{stored_h} = {stored_w * stored_h} pixels; the limit is {max_pixels}"
                )
            orientation = image.getexif().get(0x0112, 1)
            transposed = orientation in _TRANSPOSED_ORIENTATIONS
            width, height = (stored_h, stored_w) if transposed else (stored_w, stored_h)
            if draft_size is not None and image.format == "JPEG":
                stored_target = (draft_size[1], draft_size[0]) if transposed else draft_size
                image.draft("RGB" if color_mode == "RGB" else "L", stored_target)
            image.load()
            image = ImageOps.exif_transpose(image)
            image = image.convert(color_mode)
    except PayloadTooLarge:
        raise
    except UnidentifiedImageError:
        raise InvalidImage("the data is not an image in a format this server decodes") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidImage(f"the image could not be decoded: {exc}") from None
    return DecodedImage(image=image, width=width, height=height, format=image.format or "unknown")
