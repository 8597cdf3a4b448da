"""Import a Hugging Face transformers checkpoint (a ``save_pretrained`` folder) into the model repository.

    python -m export hf path/to/checkpoint --to model_repository/<name>/<version>

Supported architectures (``config.json``'s ``architectures[0]``):

* ``ViTForImageClassification`` (Dosovitskiy et al. 2021) and ``DeiTForImageClassification``:
  the graph outputs the class head's ``logits`` (B, num_labels) and ``embedding`` (B, hidden),
  the class token after the final LayerNorm (what the head takes), so every imported classifier
  also serves ``embed``, and ``attentions`` (B, depth, 1, T, T), every block's attention with
  the heads fused (:func:`fused_attentions`), for ``render=png``; the manifest's
  ``attention.prefix_tokens`` says which tokens precede the patch grid.
* ``DeiTForImageClassificationWithTeacher`` (Touvron et al. 2021, Sec. 5): ``logits`` is the
  average of the class-token head and the distillation-token head, as DeiT predicts at
  inference (transformers' forward computes exactly that average); ``embedding`` is the class
  token's, as for the others. Every DeiT (with a teacher or not) has a distillation token after
  the class token: ``attention.prefix_tokens`` is ``["class", "distillation"]``.
* DINOv2 (with registers), Swin, Swinv2 and BEiT classifiers: ``export/hf_backbones.py``, which
  registers them here (:func:`register`) with the architectures refused by name (``REFUSED``).
* ``DetrForObjectDetection`` (Carion et al. 2020) with transformers' own ResNet backbone
  (``use_timm_backbone=false``, as the hub's ``no_timm`` revisions are): ``pred_logits``
  (B, num_queries, num_labels + 1, no-object last) and ``pred_boxes`` (B, num_queries, 4),
  normalised (cx, cy, w, h) to the unpadded image; height and width are dynamic. The graph takes
  a second input, ``pixel_mask`` (B, H, W) int64, 1 on image pixels and 0 on padding, so that
  images of several sizes share a batch padded to one of a few ``buckets``
  (:func:`default_buckets`; Carion et al. 2020, Sec. 4). A timm-backbone checkpoint is
  refused with the reason: timm needs torchvision, which cannot be installed beside this torch.

The manifest's preprocessing and labels come from the checkpoint's own
``preprocessor_config.json`` (size, resample, rescale factor, mean, std, centre crop) and
``config.json`` (``id2label``; detection appends the no-object class). The graph is exported
with the dynamo exporter and checked against transformers at batch 1 and a larger batch on
images preprocessed exactly as the server will preprocess them. Nothing is downloaded: the
folder must hold the weights.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from export.onnx_export import export_info, export_onnx, parity
from service.batching.arrays import pad_inputs
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing, Size
from service.runtime.manifest import (
    SCHEMA_VERSION,
    AttentionSpec,
    ClassMapSpec,
    Manifest,
    Provenance,
    TensorSpec,
    write_manifest,
)
from service.tasks import classification, detection

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

NO_OBJECT = "no-object"
# PIL's resampling filter numbers, as preprocessor_config.json stores them.
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# The hub's DETR processors default to DETR's own resize when a config leaves it out.
_DETR_DEFAULT_SIZE = {"shortest_edge": 800, "longest_edge": 1333}


class ImportRefused(ValueError):
    """The checkpoint cannot be imported; the message says why and what to use instead."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ImportRefused(f"{path} is missing: pass a transformers save_pretrained folder")
    return json.loads(path.read_text())


def architecture_of(config: dict[str, Any], folder: Path) -> str:
    """``architectures[0]`` of ``config.json`` when it is supported.

    Raises:
        ImportRefused: an architecture this importer does not export.
    """
    architectures = config.get("architectures") or []
    if architectures and architectures[0] in REFUSED:
        raise ImportRefused(f"{folder}: architecture {architectures[0]} is not supported: {REFUSED[architectures[0]]}")
    if not architectures or architectures[0] not in TASKS:
        raise ImportRefused(
            f"{folder}: architecture {architectures[:1] or 'unknown'} is not supported; supported: {', '.join(TASKS)}"
        )
    return architectures[0]


def check_backbone(config: dict[str, Any], folder: Path) -> None:
    """Refuse a DETR whose backbone comes from timm.

    transformers builds a timm backbone when ``use_timm_backbone`` is true, which is its
    default when ``backbone_config`` is absent.

    Raises:
        ImportRefused: the checkpoint needs timm (and so torchvision).
    """
    backbone = config.get("backbone_config") or {}
    uses_timm = config.get("use_timm_backbone", not backbone) or backbone.get("model_type") == "timm_backbone"
    if uses_timm:
        name = config.get("backbone") or backbone.get("backbone") or "resnet50"
        raise ImportRefused(
            f"{folder}: this DETR checkpoint uses a timm backbone (use_timm_backbone=true, backbone {name!r}); "
            "timm needs torchvision, which cannot be installed beside this torch, so it cannot be loaded here. "
            "Use a checkpoint with transformers' own ResNet backbone (use_timm_backbone=false), such as the "
            "hub's 'no_timm' revision: facebook/detr-resnet-50 at revision no_timm."
        )


def _size_dict(value: Any, max_size: Any, square: bool) -> dict[str, int]:
    """A processor's ``size`` in its dict form (older configs store an int, DETR's with ``max_size``)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, int):
        if square:
            return {"height": value, "width": value}
        return {"shortest_edge": value, **({"longest_edge": max_size} if max_size else {})}
    raise ImportRefused(f"preprocessor_config.json: size {value!r} is not understood")


def _per_channel(value: Any, name: str) -> list[float]:
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ImportRefused(f"preprocessor_config.json: {name} needs 3 values (RGB), got {value!r}")
    return values


def preprocessing_from_processor(processor: dict[str, Any], task: str | _Head) -> Preprocessing:
    """The manifest's preprocessing for a transformers image processor's config.

    Args:
        processor: ``preprocessor_config.json`` of a ViT, DeiT or DETR image processor.
        task: a classifier's task name (a bare int ``size`` is a square, as ViT/DeiT read it)
            or a detector's (a bare int is DETR's shortest edge, ``max_size`` its longest), or the
            architecture's :class:`_Head` (its processor's defaults).

    Returns:
        RGB preprocessing: ``stretch`` for ``{"height", "width"}``, ``shortest_edge`` for
        ``{"shortest_edge"[, "longest_edge"]}``, the centre crop when ``do_center_crop``.

    Raises:
        ImportRefused: no resize (``do_resize: false``), a fixed ``pad_size`` (its pixel mask
            is not part of the exported graph), or a size form this server has no policy for.
    """
    if processor.get("do_resize", True) is False:
        raise ImportRefused("preprocessor_config.json: do_resize is false; the server needs a resize policy")
    if processor.get("pad_size"):
        raise ImportRefused("preprocessor_config.json: pad_size pads to a fixed size with a pixel mask; not supported")
    head = _head(task)
    size = _size_dict(processor.get("size", head.default_size), processor.get("max_size"), square=head.square)
    fields: dict[str, Any] = {}
    if "height" in size and "width" in size:
        fields.update(resize="stretch", size=Size(height=size["height"], width=size["width"]))
    elif "shortest_edge" in size:
        fields.update(
            resize="shortest_edge", shortest_edge=size["shortest_edge"], longest_edge=size.get("longest_edge")
        )
    else:
        raise ImportRefused(f"preprocessor_config.json: size {size} has no matching resize policy")
    if processor.get("do_center_crop", False):
        if not head.crop:
            raise ImportRefused("preprocessor_config.json: a centre crop before a detector would cut boxes off")
        crop = _size_dict(processor.get("crop_size", 224), None, square=True)
        fields["crop_size"] = Size(height=crop["height"], width=crop["width"])
    resample = processor.get("resample", 2)
    if resample not in _RESAMPLE:
        raise ImportRefused(f"preprocessor_config.json: resample {resample!r} is not a PIL filter number")
    normalize = processor.get("do_normalize", True)
    return Preprocessing(
        color_mode="RGB",
        interpolation=_RESAMPLE[resample],
        scale=float(processor.get("rescale_factor", 1 / 255)) if processor.get("do_rescale", True) else 1.0,
        mean=_per_channel(processor.get("image_mean", [0.5] * 3), "image_mean") if normalize else [0.0] * 3,
        std=_per_channel(processor.get("image_std", [0.5] * 3), "image_std") if normalize else [1.0] * 3,
        **fields,
    )


def labels_from_config(config: dict[str, Any], task: str | _Head) -> list[str]:
    """Class index -> name from ``id2label``; a no-object detector (DETR's head) appends that class last."""
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    count = max(len(id2label), int(config.get("num_labels", 0) or 0))
    labels = [id2label.get(i, f"LABEL_{i}") for i in range(count)]
    return [*labels, NO_OBJECT] if _head(task).no_object else labels


def fused_attentions(attentions: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Every block's softmax attention, heads fused by their mean: float32 (B, depth, 1, T, T).

    The mean over heads is attention rollout's first step (``service/imaging/attention.py``), taken in
    the graph so that a ViT-B/16 returns 1.9 MB a picture rather than 23 MB; the head axis is
    kept (of size 1) so the output is the manifest's (B, depth, heads, T, T) contract.
    """
    return torch.stack([a.mean(dim=1, keepdim=True) for a in attentions], dim=1)


class _Classifier(nn.Module):
    """(B, 3, H, W) pixel values -> (logits (B, num_labels), embedding (B, hidden), attentions (B, depth, 1, T, T)).

    ``embedding`` is the class token after the backbone's final LayerNorm: the head's input
    (ViT, DeiT; the distilled DeiT's class-token head too). ``attentions``: :func:`fused_attentions`.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.layernorm = getattr(model, model.base_model_prefix).layernorm

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = self.model(pixel_values=pixel_values, output_hidden_states=True, output_attentions=True)
        embedding = self.layernorm(outputs.hidden_states[-1][:, 0])
        return outputs.logits, embedding, fused_attentions(outputs.attentions)


class _Detector(nn.Module):
    """(B, 3, H, W) pixel values -> (pred_logits (B, Q, num_labels + 1), pred_boxes (B, Q, 4) cxcywh in [0, 1])."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.model(pixel_values=pixel_values)
        return outputs.logits, outputs.pred_boxes


class _MaskedDetector(nn.Module):
    """:class:`_Detector` with transformers' ``pixel_mask`` int64 (B, H, W) as a second input.

    ``DetrForObjectDetection(pixel_values, pixel_mask)``: the backbone's mask, downsampled to
    each feature map, keeps padded positions out of the sine position encoding's normalisation
    and out of the encoder's and decoder's attention keys; ``pred_boxes`` are normalised to the
    unpadded image.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, pixel_values: torch.Tensor, pixel_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # None (a processor with no longest_edge, so no buckets): exported with one input.
        outputs = self.model(pixel_values=pixel_values, pixel_mask=pixel_mask)
        return outputs.logits, outputs.pred_boxes


@dataclass(frozen=True)
class _Head:
    """How one kind of checkpoint is exported; the only place the importer's tasks differ.

    Attributes:
        task: the registered task (its name goes into the manifest).
        wrapper: the transformers model -> a module from pixel values to ``outputs``.
        outputs: the graph's output names, in order; ``roles`` names their roles.
        default_size: the processor's ``size`` when its config leaves it out.
        square: a bare int ``size`` is a square (ViT/DeiT) rather than a shortest edge (DETR).
        no_object: labels get DETR's no-object class last.
        crop: a centre crop is allowed (a detector's boxes would be cut off).
        prefix_tokens: config.json -> the tokens before the patch grid (``AttentionSpec.prefix_tokens``)
            when the wrapper's last output is :func:`fused_attentions`; None: no attention output.
        no_attention_reason: why there is none (the manifest's ``no_attention_reason``).
        class_map_grid: (config.json, input (H, W)) -> the final token grid (rows, cols) when the
            wrapper's last output is per-token class scores (``ClassMapSpec``); None: no such output.
        note: config.json -> a line for the manifest's notes (how the head computes), or "".
        mask: the wrapper takes a ``pixel_mask`` after the pixel values; a ``shortest_edge``
            policy with ``longest_edge`` then gets :func:`default_buckets`.
    """

    task: str
    wrapper: Callable[[PreTrainedModel], nn.Module]
    outputs: tuple[str, ...]
    roles: dict[str, str]
    default_size: dict[str, int]
    square: bool
    no_object: bool
    crop: bool
    prefix_tokens: Callable[[dict[str, Any]], list[str]] | None = None
    no_attention_reason: str | None = None
    class_map_grid: Callable[[dict[str, Any], tuple[int, int]], tuple[int, int]] | None = None
    note: Callable[[dict[str, Any]], str] | None = None
    task_options: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    check: Callable[[dict[str, Any], Path], None] | None = None
    exporting: Callable[[PreTrainedModel], AbstractContextManager[Any]] | None = None
    mask: bool = False


def register(architecture: str, head: _Head) -> None:
    """Make ``architecture`` (a config.json ``architectures[0]``) importable with ``head``."""
    HEADS[architecture] = head
    TASKS[architecture] = head.task


_CLASSIFIER = _Head(
    classification.TASK.name,
    _Classifier,
    ("logits", "embedding", "attentions"),
    {"logits": "logits", "embedding": "embedding"},
    {"height": 224, "width": 224},
    square=True,
    no_object=False,
    crop=True,
    prefix_tokens=lambda config: ["class"],
)
# Every transformers DeiT has the distillation token after the class token (Touvron et al. 2021,
# Sec. 5), the one fine-tuned without a teacher too.
_DEIT = replace(_CLASSIFIER, prefix_tokens=lambda config: ["class", "distillation"])
_DISTILLED = replace(_DEIT, note=lambda config: "logits = (class head + distillation head) / 2, DeiT's inference rule")
_DETECTOR = _Head(
    detection.TASK.name,
    _MaskedDetector,
    ("pred_logits", "pred_boxes"),
    {"logits": "pred_logits", "boxes": "pred_boxes"},
    _DETR_DEFAULT_SIZE,
    square=False,
    no_object=True,
    crop=False,
    check=lambda config, folder: check_backbone(config, folder),
    mask=True,
)
HEADS = {
    "ViTForImageClassification": _CLASSIFIER,
    "DeiTForImageClassification": _DEIT,
    "DeiTForImageClassificationWithTeacher": _DISTILLED,
    "DetrForObjectDetection": _DETECTOR,
}
TASKS = {architecture: head.task for architecture, head in HEADS.items()}  # architecture -> task name
REFUSED: dict[str, str] = {}  # architecture -> why it is refused (named in the refusal)


def _head(task: str | _Head) -> _Head:
    if isinstance(task, _Head):
        return task
    return next(head for head in HEADS.values() if head.task == task)


def sample_image(seed: int, width: int, height: int) -> Image.Image:
    """A deterministic photo-like RGB test image: smooth colour gradients plus noise, uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    channels = [127 + 100 * np.sin(xx / (9 + 5 * c) + yy / (13 + 3 * c) + phase[c]) for c in range(3)]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 12, size=(height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="RGB")


def default_buckets(shortest_edge: int, longest_edge: int) -> list[Size]:
    """Padding buckets (H, W) for the ``shortest_edge`` policy, smallest first: at most 5.

    A resized image has one side ``shortest_edge`` (S) and the other between S and
    ``longest_edge`` (L), or its long side L and the short one under S (an image longer than
    L / S). The buckets are S x S (square photos), S x 4S/3 (4:3, the commonest photo shape,
    exactly) and S x L, and the two portrait ones: every image fits one, with at most 25 % of a
    bucket padding for an aspect ratio up to 4:3 (S=800, L=1333: 800x800, 800x1066, 800x1333,
    1066x800, 1333x800; 1066 is what the processor's arithmetic gives a 4:3 photo).
    """
    sides = [shortest_edge]
    four_three = shortest_edge * 4 // 3
    if shortest_edge < four_three < longest_edge:
        sides.append(four_three)
    if longest_edge > shortest_edge:
        sides.append(longest_edge)
    landscape = [Size(height=shortest_edge, width=side) for side in sides]
    portrait = [Size(height=side, width=shortest_edge) for side in sides[1:]]
    return sorted([*landscape, *portrait], key=lambda b: (b.height * b.width, b.height))


def pad_to_bucket(images: list[np.ndarray], bucket: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, h, w) arrays -> float32 (B, C, H, W) padded as the server pads them, and its int64 (B, H, W) mask.

    :func:`service.batching.arrays.pad_inputs` into new arrays; ``bucket`` is (H, W).
    """
    batch = np.empty((len(images), images[0].shape[0], *bucket), np.float32)
    mask = np.empty((len(images), *bucket), np.int64)
    pad_inputs(images, batch, mask)
    return torch.from_numpy(batch), torch.from_numpy(mask)


def _masked_parity_batches(preprocess: Preprocessor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Padded batches with their masks: a landscape photo alone in its bucket, then 3 photos of
    other sizes padded together to the bucket of the largest (as the server's batcher forms them)."""
    alone = preprocess(sample_image(0, 640, 500))  # 5:4: padded on the right within the S x 4S/3 bucket
    sizes = ((600, 480), (640, 640), (560, 480))  # (W, H): 5:4, square, 7:6
    mixed = [preprocess(sample_image(seed, w, h)) for seed, (w, h) in enumerate(sizes, 1)]
    spec = preprocess.spec
    shared = spec.bucket_for(max(a.shape[1] for a in mixed), max(a.shape[2] for a in mixed))
    alone_bucket = spec.bucket_for(alone.shape[1], alone.shape[2])
    assert shared is not None and alone_bucket is not None, "called for a spec with buckets"
    return [pad_to_bucket([alone], alone_bucket), pad_to_bucket(mixed, shared)]


def _parity_batches(preprocess: Preprocessor) -> list[torch.Tensor]:
    """Batch 1 of a landscape image and batch 2 of portrait ones (or 4 of fixed-size ones), preprocessed."""
    if preprocess.dynamic:
        landscape = [preprocess(sample_image(0, 640, 480))]
        portrait = [preprocess(sample_image(seed, 480, 640)) for seed in (1, 2)]
        return [torch.from_numpy(np.stack(landscape)), torch.from_numpy(np.stack(portrait))]
    images = [preprocess(sample_image(seed, 400, 300)) for seed in range(4)]
    return [torch.from_numpy(np.stack(images[:1])), torch.from_numpy(np.stack(images))]


def load_model(folder: Path, architecture: str, *, eager: bool = False) -> PreTrainedModel:
    """The checkpoint as its transformers class, in eval mode, from local files only.

    ``eager``: transformers' eager attention, the implementation that returns the attention
    weights (SDPA computes the same outputs without them).
    """
    import transformers

    kwargs = {"attn_implementation": "eager"} if eager else {}
    model = getattr(transformers, architecture).from_pretrained(str(folder), local_files_only=True, **kwargs)
    return model.eval()


def export_hf(folder: Path, out: Path, *, opset: int) -> Manifest:
    """Export a transformers checkpoint folder to ``out/model.onnx`` and write ``out/model.json``.

    Raises:
        ImportRefused: an unsupported architecture or processor, or a timm-backbone DETR.
        ParityError: ONNX Runtime and transformers differ by more than 1e-4.
    """
    import transformers

    config = _read_json(folder / "config.json")
    processor = _read_json(folder / "preprocessor_config.json")
    architecture = architecture_of(config, folder)
    head = HEADS[architecture]
    if head.check is not None:
        head.check(config, folder)
    preprocessing = preprocessing_from_processor(processor, head)
    if (
        head.mask
        and preprocessing.resize == "shortest_edge"
        and preprocessing.longest_edge
        and not preprocessing.crop_size
    ):
        buckets = default_buckets(preprocessing.shortest_edge or 0, preprocessing.longest_edge)
        preprocessing = Preprocessing.model_validate(
            {**preprocessing.model_dump(), "buckets": [b.model_dump() for b in buckets]}
        )
    labels = labels_from_config(config, head)
    model = load_model(folder, architecture, eager=head.prefix_tokens is not None)
    wrapper = head.wrapper(model)
    output_names = head.outputs

    preprocess = Preprocessor(preprocessing)
    batches: list[Any] = _masked_parity_batches(preprocess) if preprocessing.buckets else _parity_batches(preprocess)
    first, example = (batches[0], batches[-1]) if preprocessing.buckets else ((batches[0],), (batches[-1], None))
    with torch.no_grad():
        probe = wrapper(*first)
    width = probe[0].shape[-1]  # the class scores come first
    if width != len(labels):
        raise ImportRefused(f"{folder}: the model outputs {width} classes but id2label gives {len(labels)} labels")
    path = out / "model.onnx"
    with head.exporting(model) if head.exporting else nullcontext():
        export_onnx(
            wrapper,
            example[0],
            path,
            output_names=output_names,
            dynamic_hw=preprocess.dynamic,
            mask=example[1],
            opset=opset,
        )
    diffs = parity(wrapper, path, batches)

    c, h, w = preprocess.output_shape
    hw: list[int | str] = ["height", "width"] if preprocess.dynamic else [h, w]
    parameters = sum(p.numel() for p in model.parameters())
    notes = [
        f"{parameters / 1e6:.1f}M parameters; transformers {transformers.__version__}; preprocessing and labels "
        f"from the checkpoint's {processor.get('image_processor_type', 'image processor')} config and id2label",
    ]
    if head.note is not None:
        notes.append(head.note(config))
    attention = None
    if head.prefix_tokens is not None:
        patch = int(config.get("patch_size", 16))
        grid = Size(height=h // patch, width=w // patch)
        attention = AttentionSpec(output=output_names[-1], grid=grid, prefix_tokens=head.prefix_tokens(config))
        tokens = len(attention.prefix_tokens) + grid.height * grid.width
        if probe[-1].shape[-1] != tokens:  # the rollout would not fit: an importer bug, never a served model
            raise ImportRefused(f"{folder}: {probe[-1].shape[-1]} attention tokens, expected {tokens} for {attention}")
    class_maps = None
    if head.class_map_grid is not None:
        rows, cols = head.class_map_grid(config, (h, w))
        class_maps = ClassMapSpec(output=output_names[-1], grid=Size(height=rows, width=cols))
        if probe[-1].shape[1] != rows * cols:
            raise ImportRefused(f"{folder}: {probe[-1].shape[1]} final tokens, expected a {rows}x{cols} grid")
    if head.no_object:
        notes.append(f"pred_logits has {len(labels)} columns, the last ('{NO_OBJECT}') DETR's no-object class")
    if preprocessing.buckets:
        notes.append(
            "pixel_mask int64 (B, H, W): 1 on image pixels, 0 on the padding to the bucket; pred_boxes are "
            "normalised to the unpadded image, as transformers' post_process_object_detection reads them with "
            "each image's own target_sizes"
        )
    source = config.get("_name_or_path") or folder.name
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=head.task,
        description=f"{architecture} imported from the transformers checkpoint {source}",
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, *hw]),
        pixel_mask="pixel_mask" if preprocessing.buckets else None,
        outputs=list(output_names),
        roles=head.roles,
        task_options=head.task_options(config) if head.task_options else None,
        preprocessing=preprocessing,
        labels=labels,
        provenance=Provenance(
            training_data=f"not known here: a Hugging Face transformers checkpoint ({source}) trained elsewhere",
            recipe=f"trained outside patchserve; imported with: python -m export hf {folder} --to {out}",
            metrics={},
            export=export_info(opset, diffs),
            notes="; ".join(notes),
        ),
        attention=attention,
        class_maps=class_maps,
        no_attention_reason=head.no_attention_reason,
    )
    write_manifest(manifest, out / "model.json")
    return manifest


# The backbone families (DINOv2, Swin, Swinv2, BEiT) and the DETR family (YOLOS, Conditional and
# Deformable DETR, RT-DETR v1/v2, D-FINE, LW-DETR, RF-DETR) register themselves into HEADS.
from export import hf_backbones, hf_detectors  # noqa: E402, F401
