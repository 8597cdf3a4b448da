"""Preprocessing in numpy: a decoded Pillow image -> the model's float32 input tensor.

Built once per model from its manifest (timm keeps preprocessing with each model's config;
here the manifest carries it), never per request.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from service.imaging.spec import Preprocessing

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def keep_aspect_size(height: int, width: int, shortest_edge: int, longest_edge: int | None) -> tuple[int, int]:
    """The (height, width) of the ``shortest_edge`` policy for an image of (height, width) pixels.

    The shorter side becomes ``shortest_edge``; if the longer side would then exceed
    ``longest_edge``, the longer side becomes ``longest_edge`` instead (rounded to the nearest
    pixel) and the shorter side follows. The side that is not set is truncated to whole pixels.
    This is the arithmetic of DETR's resize (Carion et al. 2020, Sec. 4: shortest side 800,
    longest at most 1333) as the Hugging Face ``DetrImageProcessor`` computes it, so the same
    image gets the same input size here and there.
    """
    short, long = min(height, width), max(height, width)
    target, exact = shortest_edge, None
    if longest_edge is not None and long / short * shortest_edge > longest_edge:
        exact = longest_edge * short / long  # the shorter side that puts the longer one at longest_edge
        target = round(exact)
    if short == target:
        return height, width
    base = exact if exact is not None else target
    if width < height:
        return int(base * height / width), target
    return target, int(base * width / height)


class Preprocessor:
    """The manifest's preprocessing, built once per model.

    ``__call__`` maps a Pillow image in the manifest's colour mode to the model input:
    a float32 array (C, H, W), ``(pixel * scale - mean[c]) / std[c]``.
    """

    def __init__(self, spec: Preprocessing) -> None:
        self.spec = spec
        self.size = (spec.size.width, spec.size.height) if spec.size else None  # Pillow order: (W, H)
        self.resample = _RESAMPLE[spec.interpolation]
        std = np.asarray(spec.std, dtype=np.float32)
        # One fused multiply-add per pixel: x * (scale / std) - mean / std.
        self._gain = (spec.scale / std).astype(np.float32)
        self._bias = (np.asarray(spec.mean, dtype=np.float32) / std).astype(np.float32)

    @property
    def dynamic(self) -> bool:
        """True when H and W of the output depend on the image (``shortest_edge`` without a crop)."""
        return self.spec.resize == "shortest_edge" and self.spec.crop_size is None

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the arrays ``__call__`` returns; for a dynamic policy, that of a square image."""
        channels = 1 if self.spec.color_mode == "L" else 3
        if self.spec.crop_size is not None:
            return (channels, self.spec.crop_size.height, self.spec.crop_size.width)
        if self.size is None:
            side = self.spec.shortest_edge
            return (channels, side, side)
        return (channels, self.size[1], self.size[0])

    @property
    def draft_size(self) -> tuple[int, int]:
        """(width, height) a JPEG may be draft-decoded down to without losing detail.

        For ``shortest_edge`` a square of that side: a draft no smaller in either dimension
        keeps the shorter side at least ``shortest_edge`` and the longer one at least what
        the resize asks of it.
        """
        if self.size is None:
            return (self.spec.shortest_edge, self.spec.shortest_edge)
        return self.size

    def content_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) in input pixels an image of ``width`` x ``height`` pixels fills (before any crop).

        ``stretch`` (and ``center_crop``, whose central region of the image fills it) fills
        ``size``; ``letterbox`` scales by ``min(size.width / width, size.height / height)`` and
        rounds, leaving padding at the bottom or right; ``shortest_edge`` is
        :func:`keep_aspect_size`, the whole input.
        """
        if self.spec.resize in ("stretch", "center_crop"):
            return self.size
        if self.spec.resize == "letterbox":
            scale = min(self.size[0] / width, self.size[1] / height)
            return (
                max(1, min(self.size[0], round(width * scale))),
                max(1, min(self.size[1], round(height * scale))),
            )
        h, w = keep_aspect_size(height, width, self.spec.shortest_edge, self.spec.longest_edge)
        return (max(1, w), max(1, h))  # a 1 x 40000 strip would otherwise get a side of 0 pixels

    def box_scale(self, image_size: tuple[int, int], displayed_size: tuple[int, int]) -> tuple[float, float]:
        """Pixels of the displayed image per unit of normalised input coordinate, (sx, sy).

        A detector's box coordinate x in [0, 1] of the input frame is ``x * sx`` pixels of
        the displayed image. With ``stretch`` and ``shortest_edge`` the input frame is the
        whole image (sx = displayed width); with ``letterbox`` it also holds the padding, so
        sx = displayed width * size.width / content width.

        Args:
            image_size: (width, height) of the image this preprocessor was given (a JPEG may
                have been draft-decoded smaller than displayed).
            displayed_size: (width, height) of the full-resolution image as the client
                displays it (after EXIF orientation), in pixels.
        """
        if self.spec.resize != "letterbox":
            # No padding: the input frame is the image, whatever size it was decoded at.
            return (float(displayed_size[0]), float(displayed_size[1]))
        content_w, content_h = self.content_size(*image_size)
        return (
            self.size[0] / content_w * displayed_size[0],
            self.size[1] / content_h * displayed_size[1],
        )

    def input_region(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The part of a ``width`` x ``height`` image that the model input covers.

        ``stretch`` and ``shortest_edge`` cover the whole image; ``center_crop`` the centre
        region with the input's aspect ratio: scale ``s = max(size.width / width, size.height /
        height)``, region ``size.width / s`` x ``size.height / s`` pixels, centred; a
        ``crop_size`` the centre crop mapped back to image pixels; ``letterbox`` the image and
        the padding beyond its bottom and right edges (the region extends past the image).

        Returns:
            (left, top, right, bottom) in pixels of that image, floats (Pillow's ``box`` order).
        """
        if self.spec.resize == "letterbox":
            content_w, content_h = self.content_size(width, height)
            return (0.0, 0.0, self.size[0] * width / content_w, self.size[1] * height / content_h)
        if self.spec.resize != "center_crop":
            if self.spec.crop_size is None:
                return (0.0, 0.0, float(width), float(height))
            content_w, content_h = self.content_size(width, height)
            crop_w, crop_h = self.spec.crop_size.width, self.spec.crop_size.height
            sx, sy = width / content_w, height / content_h
            left, top = (content_w - crop_w) // 2 * sx, (content_h - crop_h) // 2 * sy
            return (left, top, left + crop_w * sx, top + crop_h * sy)
        # Which side fits is decided in integers (size.width / width >= size.height / height, cross-
        # multiplied): that side is the whole image, exactly, and the other is the exact quotient
        # of integers, correctly rounded, so it never exceeds the image. Computed as 32 / (32 / s),
        # the region came out one ulp larger than s for sides such as 49, 98, 479, 1003 and its
        # box started below 0, which Pillow refuses (Pillow#4087).
        out_w, out_h = self.size
        if out_w * height >= out_h * width:  # the width fits; the height is cropped
            crop_w, crop_h = float(width), out_h * width / out_w
        else:
            crop_w, crop_h = out_w * height / out_h, float(height)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        return (left, top, min(left + crop_w, float(width)), min(top + crop_h, float(height)))

    def __call__(self, image: Image.Image) -> np.ndarray:
        """Resize (pad, for ``letterbox``; crop, with ``crop_size`` or ``center_crop``) and normalise ``image``.

        Args:
            image: Pillow image in ``spec.color_mode``.

        Returns:
            float32 array (C, H, W): H, W = ``crop_size``, else ``size`` (stretch, letterbox,
            center_crop), else those of :meth:`content_size` (shortest_edge).
        """
        if image.mode != self.spec.color_mode:
            raise ValueError(f"expected a {self.spec.color_mode} image, got {image.mode}")
        target = self.content_size(*image.size)
        if self.spec.resize == "center_crop" and image.size != self.size:
            # Resample only the centre region, straight to the input size (no rounded intermediate).
            image = image.resize(self.size, self.resample, box=self.input_region(*image.size))
        elif image.size != target:
            image = image.resize(target, self.resample)
        if self.spec.crop_size is not None:
            crop_w, crop_h = self.spec.crop_size.width, self.spec.crop_size.height
            left, top = (image.width - crop_w) // 2, (image.height - crop_h) // 2
            image = image.crop((left, top, left + crop_w, top + crop_h))
        pixels = np.asarray(image)  # uint8 (H, W, C), or (H, W) for "L"
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]  # (h, w) -> (h, w, 1)
        if self.spec.resize == "letterbox" and target != self.size:  # letterbox: pad the bottom and right
            padded = np.full((self.size[1], self.size[0], pixels.shape[2]), self.spec.pad_value, dtype=pixels.dtype)
            padded[: target[1], : target[0]] = pixels
            pixels = padded  # (H, W, C)
        h, w, channels = pixels.shape
        out = np.empty((channels, h, w), dtype=np.float32)  # (C, H, W)
        for c in range(channels):  # straight from uint8 HWC into float32 CHW: no temporaries (~10x faster)
            np.multiply(pixels[:, :, c], self._gain[c], out=out[c], dtype=np.float32)
            np.subtract(out[c], self._bias[c], out=out[c])
        return out
