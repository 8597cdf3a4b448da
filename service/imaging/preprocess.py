"""Preprocessing in numpy: a decoded Pillow image -> the model's float32 input tensor.

Built once per model from its manifest (timm keeps preprocessing with each model's config;
here the manifest carries it), never per request. The geometry that differs between resize
policies is each policy's (:mod:`service.imaging.resize`); this module asks the one the spec names.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from service.imaging import resize
from service.imaging.spec import Preprocessing

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


class Preprocessor:
    """The manifest's preprocessing, built once per model.

    ``__call__`` maps a Pillow image in the manifest's colour mode to the model input:
    a float32 array (C, H, W), ``(pixel * scale - mean[c]) / std[c]``.
    """

    def __init__(self, spec: Preprocessing, *, scaled_decode: bool = True) -> None:
        self.spec = spec
        self.scaled_decode = scaled_decode  # False: draft_size is None, every image is decoded at full size
        self.policy = resize.get(spec.resize)
        self.size = (spec.size.width, spec.size.height) if spec.size else None  # Pillow order: (W, H)
        self.resample = _RESAMPLE[spec.interpolation]
        std = np.asarray(spec.std, dtype=np.float32)
        # One fused multiply-add per pixel: x * (scale / std) - mean / std.
        self._gain = (spec.scale / std).astype(np.float32)
        self._bias = (np.asarray(spec.mean, dtype=np.float32) / std).astype(np.float32)

    @property
    def dynamic(self) -> bool:
        """True when H and W of the output depend on the image (``shortest_edge`` without a crop)."""
        return self.policy.dynamic(self.spec)

    @property
    def frame_size(self) -> tuple[int, int]:
        """``size`` as (width, height), for a policy that needs it (its ``check`` refuses a spec without)."""
        assert self.size is not None, f"the {self.spec.resize} policy needs size"
        return self.size

    @property
    def shortest_edge(self) -> int:
        """``spec.shortest_edge``, for a spec without ``size`` (``shortest_edge``'s ``check`` refuses one without)."""
        assert self.spec.shortest_edge is not None, f"the {self.spec.resize} policy needs shortest_edge"
        return self.spec.shortest_edge

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the arrays ``__call__`` returns; for a dynamic policy, that of a square image."""
        channels = 1 if self.spec.color_mode == "L" else 3
        if self.spec.crop_size is not None:
            return (channels, self.spec.crop_size.height, self.spec.crop_size.width)
        width, height = self.policy.nominal_size(self)
        return (channels, height, width)

    @property
    def draft_size(self) -> tuple[int, int] | None:
        """(width, height) a JPEG or WebP may be decoded down to (a scaled decode) before the resize.

        For ``shortest_edge`` a square of that side: a draft no smaller in either dimension
        keeps the shorter side at least ``shortest_edge`` and the longer one at least what
        the resize asks of it. None when ``scaled_decode`` is off (the setting
        ``PATCHSERVE_SCALED_DECODE``): the pixels are then those of a full-size decode.
        """
        return self.policy.nominal_size(self) if self.scaled_decode else None

    def content_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) in input pixels an image of ``width`` x ``height`` pixels fills (before any crop).

        ``stretch`` (and ``center_crop``, whose central region of the image fills it) fills
        ``size``; ``letterbox`` scales by ``min(size.width / width, size.height / height)`` and
        rounds, leaving padding at the bottom or right; ``shortest_edge`` is
        :func:`~service.imaging.resize.keep_aspect_size`, the whole input.
        """
        return self.policy.content_size(self, width, height)

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
        return self.policy.box_scale(self, image_size, displayed_size)

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
        return self.policy.input_region(self, width, height)

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
        image = self.policy.resized(self, image, target)
        if self.spec.crop_size is not None:
            crop_w, crop_h = self.spec.crop_size.width, self.spec.crop_size.height
            left, top = (image.width - crop_w) // 2, (image.height - crop_h) // 2
            image = image.crop((left, top, left + crop_w, top + crop_h))
        pixels = np.asarray(image)  # uint8 (H, W, C), or (H, W) for "L"
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]  # (h, w) -> (h, w, 1)
        pixels = self.policy.padded(self, pixels, target)  # letterbox: pad the bottom and right
        h, w, channels = pixels.shape
        out = np.empty((channels, h, w), dtype=np.float32)  # (C, H, W)
        for c in range(channels):  # straight from uint8 HWC into float32 CHW: no temporaries (~10x faster)
            np.multiply(pixels[:, :, c], self._gain[c], out=out[c], dtype=np.float32)
            np.subtract(out[c], self._bias[c], out=out[c])
        return out
