"""The manifest's preprocessing section: how a decoded image becomes the model's input tensor.

Part of the manifest (``model.json``, :mod:`service.runtime.manifest`), defined beside the code
that carries it out so that preprocessing needs nothing of the runtime.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.imaging import resize as policies


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Size(_Strict):
    """A size in pixels."""

    height: int = Field(gt=0)
    width: int = Field(gt=0)


Channel = Annotated[int, Field(ge=0, le=255)]  # one 8-bit colour component
MAX_BUCKETS = 8  # padding buckets per model: each is warmed at every batch size


class Preprocessing(_Strict):
    """How a decoded image becomes the model's input tensor.

    The image is first converted to ``color_mode``, then resized by the policy named ``resize``
    (one class each in :mod:`service.imaging.resize`: ``stretch``, ``shortest_edge``,
    ``letterbox``, ``center_crop``; their docstrings say what each outputs).

    Then, with ``crop_size``, the centre ``crop_size`` region is kept (the Hugging Face
    ``do_center_crop`` step: offsets ``(H - crop.height) // 2``, ``(W - crop.width) // 2``).
    Then ``x = (pixel * scale - mean[c]) / std[c]`` per channel, float32, channels first.
    Transparent pixels (alpha, palette or colour-key transparency) are first composited onto
    ``background`` (optional; white by default).

    With ``buckets`` (a graph with a pixel mask, the manifest's ``pixel_mask``), an image of its
    own size (C, h, w) is then padded bottom and right with 0 (in input space, as the Hugging
    Face ``DetrImageProcessor.pad`` does) to the first bucket, in the listed order, that holds it
    (list them smallest first), and images of one bucket share a batch (Carion et al. 2020,
    Sec. 4: DETR pads a batch and masks the padding).
    """

    color_mode: Literal["L", "RGB"]
    resize: str = Field(policies.STRETCH.name, description="The resize policy, a name in service.imaging.resize.")
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
    longest_edge: int | None = Field(
        None, gt=0, description="shortest_edge policy: the cap on the longer side; fit policy: the longest side."
    )
    crop_size: Size | None = Field(None, description="Centre crop after resizing (None: no crop).")
    pad_value: int = Field(0, ge=0, le=255, description="letterbox: the pixel value (0-255) of the padding")
    buckets: list[Size] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BUCKETS,
        description="Padded input shapes (H, W; smallest first) for a graph with a pixel mask; each image is padded "
        "to the first that holds it. None: no padding, every image its own shape.",
    )

    def bucket_for(self, height: int, width: int) -> tuple[int, int] | None:
        """(H, W) of the first bucket that holds an input of ``height`` x ``width``; None without buckets.

        Raises:
            ValueError: none holds it (the validator makes that impossible for the policy's outputs).
        """
        if self.buckets is None:
            return None
        for bucket in self.buckets:
            if bucket.height >= height and bucket.width >= width:
                return bucket.height, bucket.width
        raise ValueError(f"no bucket holds a {height}x{width} input")

    @model_validator(mode="after")
    def _per_channel(self) -> Preprocessing:
        channels = 1 if self.color_mode == "L" else 3
        if len(self.mean) != channels or len(self.std) != channels:
            raise ValueError(f"mean and std need {channels} value(s) for color_mode {self.color_mode!r}")
        if any(s <= 0 for s in self.std):
            raise ValueError("std values must be > 0")
        return self

    @field_validator("resize")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in policies.names():
            raise ValueError(f"unknown resize policy {name!r}; registered: {', '.join(policies.names())}")
        return name

    @model_validator(mode="after")
    def _resize_policy(self) -> Preprocessing:
        policy = policies.get(self.resize)
        policy.check(self)
        if self.buckets is not None:
            bounds = policy.bounds(self)
            if bounds is None:
                raise ValueError(f"buckets: the {self.resize} policy's outputs have no bound (set longest_edge)")
            for height, width in bounds:
                if not any(b.height >= height and b.width >= width for b in self.buckets):
                    raise ValueError(f"buckets: none holds a resized {height}x{width} (HxW) image")
        return self
