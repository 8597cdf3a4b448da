"""Resize policies: how a decoded image of any size becomes the model's input frame; one class each.

A policy is named by the manifest's ``preprocessing.resize`` and found through :func:`get`; the
preprocessor (:class:`service.imaging.preprocess.Preprocessor`), the manifest's checks and the
tasks ask the policy, and nothing outside this module compares a policy's name. A new policy
is one :class:`ResizePolicy` subclass here, ending with ``register(<Policy>())``
(docs/STYLE.md, "How to add a resize policy").

Every method takes the :class:`~service.imaging.preprocess.Preprocessor` (``pre``): its
``spec`` (the manifest's :class:`~service.imaging.spec.Preprocessing`) and ``size``, the
``(width, height)`` of ``spec.size`` in Pillow order (None when the spec names none). Sizes are
``(width, height)`` in pixels unless said otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from service.imaging.preprocess import Preprocessor
    from service.imaging.spec import Preprocessing


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


class ResizePolicy:
    """One resize policy. The defaults are those of a policy that fills the frame with the whole image.

    Attributes:
        name: the manifest's ``preprocessing.resize`` value.
        crops: True when the input sees only part of the image (a detector refuses such a policy:
            its boxes map back through the whole input frame).
    """

    name: ClassVar[str]
    crops: ClassVar[bool] = False

    def check(self, spec: Preprocessing) -> None:
        """Refuse a spec this policy cannot serve (raise ValueError naming the field); the default needs ``size``."""
        if spec.size is None:
            raise ValueError(f"the {self.name} policy needs size")
        if spec.crop_size is not None:
            raise ValueError(f"{self.name} takes no crop_size")

    def dynamic(self, spec: Preprocessing) -> bool:
        """True when H and W of the output depend on the image."""
        return False

    def bounds(self, spec: Preprocessing) -> list[tuple[int, int]] | None:
        """(height, width) sizes such that every output of this policy fits inside one of them.

        Padding buckets must hold each (``spec.buckets``). None: outputs are unbounded, so no
        bucket list can hold them. The default: the one fixed output size.
        """
        frame = spec.crop_size or spec.size
        return None if frame is None else [(frame.height, frame.width)]

    def content_size(self, pre: Preprocessor, width: int, height: int) -> tuple[int, int]:
        """(width, height) in input pixels that an image of ``width`` x ``height`` pixels fills (before any crop)."""
        return pre.frame_size

    def nominal_size(self, pre: Preprocessor) -> tuple[int, int]:
        """(width, height) of a square image's output before any crop (the frame for a fixed-size policy).

        Also the JPEG draft size: a draft no smaller than it in either side keeps every side the
        resize asks for.
        """
        return pre.frame_size

    def box_scale(
        self, pre: Preprocessor, image_size: tuple[int, int], displayed_size: tuple[int, int]
    ) -> tuple[float, float]:
        """Pixels of the displayed image per unit of normalised input coordinate, (sx, sy).

        The default: no padding, the input frame is the image, whatever size it was decoded at.
        """
        return (float(displayed_size[0]), float(displayed_size[1]))

    def input_region(self, pre: Preprocessor, width: int, height: int) -> tuple[float, float, float, float]:
        """(left, top, right, bottom), floats, in pixels of a ``width`` x ``height`` image, that the input covers.

        The default: the whole image, or with ``crop_size`` the centre crop mapped back to image pixels.
        """
        if pre.spec.crop_size is None:
            return (0.0, 0.0, float(width), float(height))
        content_w, content_h = self.content_size(pre, width, height)
        crop_w, crop_h = pre.spec.crop_size.width, pre.spec.crop_size.height
        sx, sy = width / content_w, height / content_h
        left, top = (content_w - crop_w) // 2 * sx, (content_h - crop_h) // 2 * sy
        return (left, top, left + crop_w * sx, top + crop_h * sy)

    def resized(self, pre: Preprocessor, image: Image.Image, target: tuple[int, int]) -> Image.Image:
        """``image`` resampled to ``target`` (its :meth:`content_size`), or itself when it has that size."""
        if image.size != target:
            return image.resize(target, pre.resample)
        return image

    def padded(self, pre: Preprocessor, pixels: np.ndarray, target: tuple[int, int]) -> np.ndarray:
        """The uint8 (H, W, C) ``pixels`` of the resized (and cropped) image, padded to the frame; default: as is."""
        return pixels


class Stretch(ResizePolicy):
    """Resize to ``size`` exactly, ignoring the aspect ratio (the Hugging Face ``ViTImageProcessor`` policy).

    Output (C, size.height, size.width); with ``crop_size``, its centre crop.
    """

    name = "stretch"

    def check(self, spec: Preprocessing) -> None:
        if spec.size is None:
            raise ValueError(f"the {self.name} policy needs size")
        if spec.crop_size and (spec.crop_size.height > spec.size.height or spec.crop_size.width > spec.size.width):
            raise ValueError("crop_size must fit inside size")


class ShortestEdge(ResizePolicy):
    """Keep the aspect ratio: the shorter side becomes ``shortest_edge``, capped by ``longest_edge``.

    :func:`keep_aspect_size` (the Hugging Face ``DetrImageProcessor`` policy). Output (C, H, W)
    with H and W depending on the image (the graph takes any size; only same-sized inputs share
    a batch), unless a ``crop_size`` fixes them.
    """

    name = "shortest_edge"

    def check(self, spec: Preprocessing) -> None:
        if spec.shortest_edge is None:
            raise ValueError("the shortest_edge policy needs shortest_edge")
        if spec.longest_edge is not None and spec.longest_edge < spec.shortest_edge:
            raise ValueError("longest_edge must be >= shortest_edge")
        if spec.crop_size and (
            spec.longest_edge is not None or max(spec.crop_size.height, spec.crop_size.width) > spec.shortest_edge
        ):
            raise ValueError("a crop after shortest_edge needs no longest_edge and must fit inside shortest_edge")

    def dynamic(self, spec: Preprocessing) -> bool:
        return spec.crop_size is None

    def bounds(self, spec: Preprocessing) -> list[tuple[int, int]] | None:
        if spec.crop_size is not None:
            return [(spec.crop_size.height, spec.crop_size.width)]
        if spec.longest_edge is None or spec.shortest_edge is None:
            return None  # a long strip keeps its short side at shortest_edge: any long side
        # the short side is at most shortest_edge (S), the long one at most longest_edge (L)
        return [(spec.shortest_edge, spec.longest_edge), (spec.longest_edge, spec.shortest_edge)]

    def nominal_size(self, pre: Preprocessor) -> tuple[int, int]:
        return (pre.shortest_edge, pre.shortest_edge)

    def content_size(self, pre: Preprocessor, width: int, height: int) -> tuple[int, int]:
        longest = pre.spec.longest_edge
        h, w = keep_aspect_size(height, width, pre.shortest_edge, longest)
        if pre.spec.buckets is not None and longest is not None and max(h, w) > longest:
            # keep_aspect_size leaves a strip whose short side rounds back to itself at its own size
            # (10x130 at 128/128): its long side then passes longest_edge and no bucket holds it.
            # With buckets the long side is capped (the Hugging Face processor, which pads to its
            # batch's largest image, keeps such a strip; here it differs by the cap only).
            scale = longest / max(h, w)
            h, w = round(h * scale), round(w * scale)
        return (max(1, w), max(1, h))  # a 1 x 40000 strip would otherwise get a side of 0 pixels


class Letterbox(ResizePolicy):
    """Keep the aspect ratio: scale by ``min(size.width / W, size.height / H)`` to fit ``size``, pad.

    The image sits at the top-left corner; the bottom and right are filled with ``pad_value``
    (DETR pads bottom and right too). Output (C, size.height, size.width); a detector's
    normalised boxes are relative to that padded frame.
    """

    name = "letterbox"

    def content_size(self, pre: Preprocessor, width: int, height: int) -> tuple[int, int]:
        scale = min(pre.frame_size[0] / width, pre.frame_size[1] / height)
        return (
            max(1, min(pre.frame_size[0], round(width * scale))),
            max(1, min(pre.frame_size[1], round(height * scale))),
        )

    def box_scale(
        self, pre: Preprocessor, image_size: tuple[int, int], displayed_size: tuple[int, int]
    ) -> tuple[float, float]:
        """The input frame also holds the padding: sx = displayed width * size.width / content width."""
        content_w, content_h = self.content_size(pre, *image_size)
        return (
            pre.frame_size[0] / content_w * displayed_size[0],
            pre.frame_size[1] / content_h * displayed_size[1],
        )

    def input_region(self, pre: Preprocessor, width: int, height: int) -> tuple[float, float, float, float]:
        """The image and the padding beyond its bottom and right edges (the region extends past the image)."""
        content_w, content_h = self.content_size(pre, width, height)
        return (0.0, 0.0, pre.frame_size[0] * width / content_w, pre.frame_size[1] * height / content_h)

    def padded(self, pre: Preprocessor, pixels: np.ndarray, target: tuple[int, int]) -> np.ndarray:
        frame_w, frame_h = pre.frame_size
        if target == (frame_w, frame_h):
            return pixels
        padded = np.full((frame_h, frame_w, pixels.shape[2]), pre.spec.pad_value, dtype=pixels.dtype)
        padded[: target[1], : target[0]] = pixels
        return padded  # (H, W, C)


class Fit(ResizePolicy):
    """Keep the aspect ratio and the pixels: an image whose longer side passes ``longest_edge`` is
    scaled down so that it equals it (sides rounded, at least 1); a smaller one is left as it is.

    For detectors trained on images at their own size with a pixel mask (``models.detr_inputs``'s
    bucket format, whose ``fit`` this is). Output (C, H, W) with H and W depending on the image, at
    most ``longest_edge`` each, so it takes ``buckets`` (padding after the resize).
    """

    name = "fit"

    def check(self, spec: Preprocessing) -> None:
        if spec.longest_edge is None:
            raise ValueError("the fit policy needs longest_edge")
        if spec.size is not None or spec.crop_size is not None or spec.shortest_edge is not None:
            raise ValueError("the fit policy takes only longest_edge (no size, crop_size or shortest_edge)")

    def dynamic(self, spec: Preprocessing) -> bool:
        return True

    def bounds(self, spec: Preprocessing) -> list[tuple[int, int]] | None:
        edge = spec.longest_edge or 0
        return [(edge, edge)]

    def nominal_size(self, pre: Preprocessor) -> tuple[int, int]:
        edge = pre.spec.longest_edge or 0
        return (edge, edge)

    def content_size(self, pre: Preprocessor, width: int, height: int) -> tuple[int, int]:
        edge = pre.spec.longest_edge or 0
        scale = min(1.0, edge / max(width, height))
        if scale == 1.0:
            return (width, height)
        return (max(1, round(width * scale)), max(1, round(height * scale)))


class CenterCrop(ResizePolicy):
    """Keep the aspect ratio: scale by ``max(size.width / W, size.height / H)`` to cover ``size``, crop the centre.

    timm's and torchvision's resize-then-centre-crop at crop fraction 1. Output
    (C, size.height, size.width); the input sees the central region of the image only.
    """

    name = "center_crop"
    crops = True

    def input_region(self, pre: Preprocessor, width: int, height: int) -> tuple[float, float, float, float]:
        """The centre region with the input's aspect ratio: ``size / s`` pixels, ``s = max(size.width / width, …)``."""
        # Which side fits is decided in integers (size.width / width >= size.height / height, cross-
        # multiplied): that side is the whole image, exactly, and the other is the exact quotient
        # of integers, correctly rounded, so it never exceeds the image. Computed as 32 / (32 / s),
        # the region came out one ulp larger than s for sides such as 49, 98, 479, 1003 and its
        # box started below 0, which Pillow refuses (Pillow#4087).
        out_w, out_h = pre.frame_size
        if out_w * height >= out_h * width:  # the width fits; the height is cropped
            crop_w, crop_h = float(width), out_h * width / out_w
        else:
            crop_w, crop_h = out_w * height / out_h, float(height)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        return (left, top, min(left + crop_w, float(width)), min(top + crop_h, float(height)))

    def resized(self, pre: Preprocessor, image: Image.Image, target: tuple[int, int]) -> Image.Image:
        """Resample only the centre region, straight to the input size (no rounded intermediate)."""
        if image.size != pre.frame_size:
            return image.resize(pre.frame_size, pre.resample, box=self.input_region(pre, *image.size))
        return image


_POLICIES: dict[str, ResizePolicy] = {}


def register(policy: ResizePolicy) -> ResizePolicy:
    """Add ``policy`` to the registry; returns it.

    Raises:
        ValueError: another policy has its name.
    """
    if policy.name in _POLICIES:
        raise ValueError(f"resize policy {policy.name!r} is already registered")
    _POLICIES[policy.name] = policy
    return policy


def unregister(name: str) -> None:
    """Remove a policy (tests that register their own); no error when it is absent."""
    _POLICIES.pop(name, None)


def get(name: str) -> ResizePolicy:
    """The policy registered as ``name``.

    Raises:
        KeyError: no such policy; the message lists the registered ones.
    """
    try:
        return _POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown resize policy {name!r}; registered: {', '.join(_POLICIES)}") from None


def names() -> list[str]:
    """The registered policies' names: the values a manifest's ``preprocessing.resize`` may take."""
    return list(_POLICIES)


STRETCH = register(Stretch())
LETTERBOX = register(Letterbox())
SHORTEST_EDGE = register(ShortestEdge())
CENTER_CROP = register(CenterCrop())
FIT = register(Fit())
