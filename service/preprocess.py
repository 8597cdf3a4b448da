"""Preprocessing in numpy: a decoded Pillow image -> the model's float32 input tensor.

Built once per model from its manifest (timm keeps preprocessing with each model's config;
here the manifest carries it), never per request.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from service.manifest import Preprocessing

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

    def __init__(self, spec: Preprocessing) -> None:
        self.spec = spec
        self.size = (spec.size.width, spec.size.height)  # Pillow order: (W, H)
        self.resample = _RESAMPLE[spec.interpolation]
        std = np.asarray(spec.std, dtype=np.float32)
        # One fused multiply-add per pixel: x * (scale / std) - mean / std.
        self._gain = (spec.scale / std).astype(np.float32)
        self._bias = (np.asarray(spec.mean, dtype=np.float32) / std).astype(np.float32)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the arrays ``__call__`` returns."""
        return (1 if self.spec.color_mode == "L" else 3, self.spec.size.height, self.spec.size.width)

    @property
    def draft_size(self) -> tuple[int, int]:
        """(width, height) a JPEG may be draft-decoded down to without losing detail."""
        return self.size

    def __call__(self, image: Image.Image) -> np.ndarray:
        """Resize and normalise ``image``.

        Args:
            image: Pillow image in ``spec.color_mode``.

        Returns:
            float32 array (C, H, W) with H, W = ``spec.size``.
        """
        if image.mode != self.spec.color_mode:
            raise ValueError(f"expected a {self.spec.color_mode} image, got {image.mode}")
        if image.size != self.size:
            image = image.resize(self.size, self.resample)
        pixels = np.asarray(image, dtype=np.float32)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]  # (H, W) -> (H, W, 1)
        normalised = pixels * self._gain - self._bias  # (H, W, C)
        return np.ascontiguousarray(normalised.transpose(2, 0, 1))  # (C, H, W)
