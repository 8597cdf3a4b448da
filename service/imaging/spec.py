"""The manifest's preprocessing section: how a decoded image becomes the model's input tensor.

Part of the manifest (``model.json``, :mod:`service.runtime.manifest`), defined beside the code
that carries it out so that preprocessing needs nothing of the runtime.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Size(_Strict):
    """A size in pixels."""

    height: int = Field(gt=0)
    width: int = Field(gt=0)


Channel = Annotated[int, Field(ge=0, le=255)]  # one 8-bit colour component


class Preprocessing(_Strict):
    """How a decoded image becomes the model's input tensor.

    Resize policies (the image is first converted to ``color_mode``):

    * ``stretch``: resize to ``size`` exactly, ignoring the aspect ratio (the Hugging Face
      ``ViTImageProcessor`` policy). Output (C, size.height, size.width).
    * ``shortest_edge``: keep the aspect ratio; the shorter side becomes ``shortest_edge``
      pixels unless the longer side would then pass ``longest_edge``, in which case the longer
      side becomes ``longest_edge`` (the Hugging Face ``DetrImageProcessor`` policy,
      ``size={"shortest_edge": 800, "longest_edge": 1333}``; sides truncated to whole pixels
      as it does). Output (C, H, W) with H and W depending on the image: the graph takes any
      size, and no padding or mask is needed since only same-sized inputs share a batch.
    * ``letterbox``: keep the aspect ratio: resize by ``min(size.width / W, size.height / H)``
      so the image fits ``size``, place it at the top-left corner and fill the bottom and right
      with ``pad_value`` (DETR pads bottom and right too). Output (C, size.height, size.width);
      a detector's normalised boxes are relative to that padded frame.
    * ``center_crop``: keep the aspect ratio: resize by ``max(size.width / W, size.height / H)``
      so the image covers ``size`` (the shorter side fits), then crop the centre ``size``
      (timm's and torchvision's resize-then-centre-crop at crop fraction 1). Output
      (C, size.height, size.width); the input sees the central region of the image only.

    Then, with ``crop_size``, the centre ``crop_size`` region is kept (the Hugging Face
    ``do_center_crop`` step: offsets ``(H - crop.height) // 2``, ``(W - crop.width) // 2``).
    Then ``x = (pixel * scale - mean[c]) / std[c]`` per channel, float32, channels first.
    Transparent pixels (alpha, palette or colour-key transparency) are first composited onto
    ``background`` (optional; white by default).
    """

    color_mode: Literal["L", "RGB"]
    resize: Literal["stretch", "letterbox", "shortest_edge", "center_crop"] = "stretch"
    size: Size | None = Field(
        None, description="The output size of the stretch, letterbox and center_crop policies (required for them)."
    )
    interpolation: Literal["nearest", "bilinear", "bicubic", "box", "hamming", "lanczos"] = "bilinear"
    scale: float = Field(1 / 255, gt=0)
    mean: list[float]
    std: list[float]
    background: tuple[Channel, Channel, Channel] = Field(
        (255, 255, 255), description="(R, G, B), 0-255, composited under transparent pixels before conversion."
    )
    shortest_edge: int | None = Field(None, gt=0, description="shortest_edge policy: the shorter side, in pixels.")
    longest_edge: int | None = Field(None, gt=0, description="shortest_edge policy: the cap on the longer side.")
    crop_size: Size | None = Field(None, description="Centre crop after resizing (None: no crop).")
    pad_value: int = Field(0, ge=0, le=255, description="letterbox: the pixel value (0-255) of the padding")

    @model_validator(mode="after")
    def _per_channel(self) -> Preprocessing:
        channels = 1 if self.color_mode == "L" else 3
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean and std need {channels} value(s) for color_mode {self.color_mode!r}")
        if any(s <= 0 for s in self.std):
            raise ValueError("std values must be > 0")
        return self

    @model_validator(mode="after")
    def _resize_policy(self) -> Preprocessing:
        if self.resize in ("stretch", "letterbox", "center_crop"):
            if self.size is None:
                raise ValueError(f"the {self.resize} policy needs size")
            if self.resize != "stretch" and self.crop_size is not None:
                raise ValueError(f"{self.resize} takes no crop_size")
            if self.crop_size and (self.crop_size.height > self.size.height or self.crop_size.width > self.size.width):
                raise ValueError("crop_size must fit inside size")
        else:
            if self.shortest_edge is None:
                raise ValueError("the shortest_edge policy needs shortest_edge")
            if self.longest_edge is not None and self.longest_edge < self.shortest_edge:
                raise ValueError("longest_edge must be >= shortest_edge")
            if self.crop_size and (
                self.longest_edge is not None or max(self.crop_size.height, self.crop_size.width) > self.shortest_edge
            ):
                raise ValueError("a crop after shortest_edge needs no longest_edge and must fit inside shortest_edge")
        return self
