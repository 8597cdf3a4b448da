"""The model manifest: everything the server needs to know about a model, beside its graph.

``model_repository/<name>/<version>/model.json`` is written by ``export/`` and validated here
on load. Unknown fields and missing required ones are start-up errors that name the file and
the field. Fields added after schema version 1 must be optional with defaults, so committed
manifests keep loading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service import tasks
from service.core.settings import MAX_REQUEST_TIMEOUT
from service.imaging.spec import Preprocessing, Size

SCHEMA_VERSION = 1


class ManifestError(Exception):
    """A manifest could not be read or validated; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """The graph's image input.

    ``shape`` is (B, C, H, W) with a symbolic (string) batch axis; H and W are integers for a
    fixed-size model or strings where the graph accepts any size.
    """

    name: str
    dtype: Literal["float32", "float16"] = "float32"
    shape: list[int | str] = Field(min_length=4, max_length=4)

    @model_validator(mode="after")
    def _batch_axis_symbolic(self) -> TensorSpec:
        if not isinstance(self.shape[0], str):
            raise ValueError("shape[0] must be a symbolic batch axis such as 'batch'")
        if not isinstance(self.shape[1], int) or self.shape[1] not in (1, 3):
            raise ValueError("shape[1] must be 1 (grayscale) or 3 (RGB) channels")
        return self


PrefixToken = Literal["class", "distillation", "register"]


class AttentionSpec(_Strict):
    """Where a ViT graph exposes its attention weights, for attention rollout (``?render=png``).

    The output holds every block's softmax attention, float32 (B, depth, heads, T, T) with
    T = P + grid.height * grid.width: first the P ``prefix_tokens`` (a ViT's class token; DeiT's
    class and distillation tokens, Touvron et al. 2021 Sec. 5; DINOv2's class token and its
    register tokens, Darcet et al. 2024 "Vision Transformers Need Registers" Sec. 2), then token
    P + r * grid.width + c, the patch in grid row r, column c of the model input.
    """

    output: str = Field(description="The graph output holding the attention weights.")
    grid: Size = Field(description="The patch grid over the model input: rows (height) and columns (width).")
    prefix_tokens: list[PrefixToken] = Field(
        ["class"],
        min_length=1,
        description="The tokens before the patch grid, in order (absent: one class token, the form written "
        "before this field). The rollout reads the class token's row and draws the patch columns only.",
    )

    @field_validator("prefix_tokens")
    @classmethod
    def _one_class_token(cls, prefix: list[str]) -> list[str]:
        if prefix.count("class") != 1:
            raise ValueError(f"prefix_tokens needs exactly one 'class' token (the rollout's query), got {prefix}")
        return prefix


class ClassMapSpec(_Strict):
    """Where a graph whose head is linear on the average of its final tokens exposes each token's class scores.

    The output is float32 (B, N, num_labels), N = grid.height * grid.width, token r * grid.width + c
    at row r, column c of the final feature grid over the model input: the head applied to each
    final token before the average, so that the average over the N tokens is the graph's logits.
    ``render=png`` draws the top class's column as a class activation map (Zhou et al. 2016,
    "Learning Deep Features for Discriminative Localization", CVPR, Sec. 2), for models with no
    attention to roll out (Swin's windowed attention).
    """

    output: str = Field(description="The graph output holding the per-token class scores.")
    grid: Size = Field(description="The final token grid over the model input: rows (height) and columns (width).")


class ExportInfo(_Strict):
    """How the graph was made and how closely it matches PyTorch."""

    exporter: str
    opset: int
    torch_version: str
    parity_max_abs_diff: dict[str, float] = Field(
        description="Max |ORT - PyTorch| over the outputs, by batch size (as a string key)."
    )


class Provenance(_Strict):
    """Where the weights came from and what they measured on held-out data."""

    training_data: str
    recipe: str = Field(description="The command that trained the checkpoint.")
    metrics: dict[str, float] = Field(description="Measured on the test split, e.g. {'test_accuracy': 0.97}.")
    export: ExportInfo
    notes: str = ""


class Batching(_Strict):
    """Per-model overrides of the server's batching settings; an omitted value keeps the setting.

    Same names, units (seconds) and bounds as the ``PATCHSERVE_*`` settings of the same name.
    """

    max_batch_size: int | None = Field(None, ge=1, le=1024)
    max_queue_delay: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False)
    queue_size: int | None = Field(None, ge=1)
    # finite and at most a day: Infinity would disable the deadline, and overflow /v2's config
    request_timeout: float | None = Field(None, gt=0.0, le=MAX_REQUEST_TIMEOUT, allow_inf_nan=False)


class Manifest(_Strict):
    """``model.json``: the contract between ``export/`` and ``service/``."""

    schema_version: Literal[1]
    task: str = Field(
        description="A registered task's name (service.tasks): what the model's own route does with its outputs."
    )
    description: str = ""
    input: TensorSpec
    pixel_mask: str | None = Field(
        None,
        description="The name of the graph's second input, int64 (B, H, W): 1 on image pixels, 0 on padding "
        "(transformers' pixel_mask). Its boxes are then relative to each unpadded image. None: one input.",
    )
    outputs: list[str] = Field(min_length=1, description="The graph outputs served, in graph order.")
    roles: dict[str, str] | None = Field(
        None,
        description="Output role -> name in outputs, e.g. {'logits': 'pred_logits', 'boxes': 'pred_boxes', "
        "'embedding': 'embedding'}; None: the task's roles in the order of outputs (the form written before "
        "roles had names). A role a companion task reads (embedding) makes the model serve that task too.",
    )
    task_options: dict[str, Any] | None = Field(
        None, description="The task's post-processing variant and its parameters (the task's Options; None: defaults)."
    )
    preprocessing: Preprocessing
    labels: list[str] = Field(
        min_length=1, description="Index -> name; a DETR detector lists the no-object class last, as DETR does."
    )
    provenance: Provenance
    batching: Batching | None = Field(None, description="Overrides of the server's batching settings.")
    attention: AttentionSpec | None = Field(
        None, description="A ViT's attention-weights output (enables ?render=png on classify); None: not exported."
    )
    class_maps: ClassMapSpec | None = Field(
        None, description="Per-token class scores for a class activation map (render=png without attention)."
    )
    no_attention_reason: str | None = Field(
        None,
        description="Why the graph exports no attention maps (e.g. Swin's windowed attention has no class token "
        "to roll out); the render=png refusal quotes it. None: no reason recorded.",
    )

    @field_validator("task")
    @classmethod
    def _registered_task(cls, task: str) -> str:
        if task not in tasks.names():
            raise ValueError(f"unknown task {task!r}; registered tasks: {', '.join(tasks.names())}")
        return task

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        channels = 1 if self.preprocessing.color_mode == "L" else 3
        if self.input.shape[1] != channels:
            raise ValueError(f"input.shape[1]={self.input.shape[1]} but color_mode needs {channels}")
        if self.preprocessing.buckets is not None and self.pixel_mask is None:
            raise ValueError("preprocessing.buckets pad images, so the graph needs a pixel_mask input")
        if self.pixel_mask is not None and self.pixel_mask == self.input.name:
            raise ValueError(f"pixel_mask {self.pixel_mask!r} is the image input's name")
        if self.attention is not None and self.attention.output not in self.outputs:
            raise ValueError(f"attention.output {self.attention.output!r} is not one of outputs {self.outputs}")
        if self.class_maps is not None and self.class_maps.output not in self.outputs:
            raise ValueError(f"class_maps.output {self.class_maps.output!r} is not one of outputs {self.outputs}")
        task = tasks.get(self.task)
        if self.roles is not None and not set(self.roles.values()) <= set(self.outputs):
            raise ValueError(f"roles {self.roles} name outputs that are not in outputs {self.outputs}")
        try:
            tasks.options(self)
        except ValidationError as exc:
            raise ValueError(f"task_options is not what a {self.task} model takes: {exc}") from None
        task.check_manifest(self)
        missing = [role for role in task.roles if role not in tasks.role_outputs(self)]
        if missing:
            raise ValueError(f"a {self.task} model needs the output role(s) {missing}; roles: {self.roles}")
        return self


def load_manifest(path: Path) -> Manifest:
    """Read and validate one ``model.json``.

    Raises:
        ManifestError: unreadable JSON or an invalid manifest; the message names ``path`` and
            every offending field (``preprocessing.mean: ...``).
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc}") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise ManifestError(f"{path}: invalid manifest: {problems}") from None


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write ``manifest`` as indented JSON (used by ``export/``)."""
    path.write_text(manifest.model_dump_json(indent=2) + "\n")
