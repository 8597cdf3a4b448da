"""The DETR family from Hugging Face checkpoints: one :class:`Family` each, registered into :mod:`export.hf`.

``python -m export hf <folder> --to model_repository/<name>/<version>`` imports a ``save_pretrained``
folder of any architecture in :data:`FAMILIES`. Every one is a set predictor trained with one-to-one
(Hungarian) matching, so it needs no NMS; the graph outputs ``pred_logits`` (B, Q, C) and
``pred_boxes`` (B, Q, 4), (cx, cy, w, h) normalised to [0, 1] of the model input, as transformers'
``<Arch>ForObjectDetection`` returns them (``logits``, ``pred_boxes``). The manifest's
``task_options`` records how the checkpoint's own image processor post-processes them
(``post_process_object_detection`` in transformers 5.24), as a rule of
:mod:`service.tasks.detection_scores`:

=================================== ============= ========================================================
architecture                         scores        source
=================================== ============= ========================================================
YolosForObjectDetection              softmax       Fang et al. 2021 (YOLOS), Sec. 2.1: DETR's no-object
ConditionalDetrForObjectDetection    sigmoid top-k Meng et al. 2021, Sec. 3.4; processor top_k=100
DeformableDetrForObjectDetection     sigmoid top-k Zhu et al. 2021, Sec. 4.1; processor top_k=100
RTDetrForObjectDetection             sigmoid top-k Zhao et al. 2024 (RT-DETR), Sec. 4.4; k = num_queries
RTDetrV2ForObjectDetection           sigmoid top-k Lv et al. 2024 (RT-DETRv2); RT-DETR's processor
DFineForObjectDetection              sigmoid top-k Peng et al. 2024 (D-FINE); RT-DETR's processor
LwDetrForObjectDetection             sigmoid top-k Chen et al. 2024 (LW-DETR); Deformable DETR's processor, 100
RfDetrForObjectDetection             sigmoid top-k Robinson et al. 2025 (RF-DETR); k = num_queries
=================================== ============= ========================================================

DETR itself (``DetrForObjectDetection``, softmax) stays in :mod:`export.hf`. Deformable DETR is
refused when its processor resizes to an image-dependent size (``shortest_edge``, the hub's form):
its graph cannot keep a dynamic height and width (:data:`_DEFORMABLE_SIZES`); with a fixed
``{"height", "width"}`` it imports. Conditional and Deformable DETR are refused with a timm
backbone (``use_timm_backbone``, their configs' default and the hub checkpoints' form): timm needs
torchvision, which cannot be installed beside this torch.

Two exporter work-arounds run while exporting (:func:`exporting`), neither changing what is computed:
transformers' ``torch_compilable_check`` (a shape assertion; RT-DETRv2 and D-FINE's deformable
attention) lowers to ``aten._is_all_true``, which has no ONNX form, so it is switched off with
transformers' own ``TRANSFORMERS_DISABLE_TORCH_CHECK=1``; and ``batch_size = len(tensor)`` (RT-DETR's
decoder input) would make the exporter fix the batch size, so ``len`` of a tensor reads its symbolic
size ``tensor.shape[0]`` in the modeling modules instead.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from export.hf import ImportRefused, _Detector, _Head, register
from service.tasks import detection
from service.tasks.detection_scores import RULES, SigmoidTopK, SoftmaxNoObject

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# The processors' own defaults when preprocessor_config.json leaves ``size`` out (transformers 5.24).
_SHORTEST_800 = {"shortest_edge": 800, "longest_edge": 1333}
_SQUARE_640 = {"height": 640, "width": 640}


def _num_queries(config: dict[str, Any]) -> int | None:
    return None  # the rule's default: the number of queries, read from the logits at serving time


def _top_100(config: dict[str, Any]) -> int | None:
    return 100


def _refuse_timm(family: str) -> Callable[[dict[str, Any], Path], None]:
    """A check refusing a checkpoint whose backbone transformers would build from timm."""

    def check(config: dict[str, Any], folder: Path) -> None:
        backbone = config.get("backbone_config") or {}
        uses_timm = config.get("use_timm_backbone", not backbone) or backbone.get("model_type") == "timm_backbone"
        if uses_timm:
            name = config.get("backbone") or backbone.get("backbone") or "resnet50"
            raise ImportRefused(
                f"{folder}: this {family} checkpoint uses a timm backbone (use_timm_backbone=true, backbone "
                f"{name!r}); timm needs torchvision, which cannot be installed beside this torch, so it cannot be "
                "loaded here. Use a checkpoint with transformers' own ResNet backbone (use_timm_backbone=false and "
                "a backbone_config of model_type 'resnet')."
            )

    return check


def _fixed_size_only(family: str, reason: str) -> Callable[[dict[str, Any], Path], None]:
    """A check refusing a checkpoint whose processor resizes to a size that depends on the image."""

    def check(config: dict[str, Any], folder: Path) -> None:
        path = folder / "preprocessor_config.json"
        processor = json.loads(path.read_text()) if path.is_file() else {}
        size = processor.get("size", _SHORTEST_800)
        if not (isinstance(size, dict) and "height" in size and "width" in size):
            raise ImportRefused(
                f"{folder}: preprocessor_config.json: size {size!r} gives every image its own input size, but a "
                f"{family} graph cannot take a dynamic height and width: {reason}. A checkpoint whose processor "
                'resizes to one size ({"height": H, "width": W}) imports.'
            )

    return check


def _all(*checks: Callable[[dict[str, Any], Path], None]) -> Callable[[dict[str, Any], Path], None]:
    def check(config: dict[str, Any], folder: Path) -> None:
        for one in checks:
            one(config, folder)

    return check


_DEFORMABLE_SIZES = (
    "DeformableDetrModel.forward builds its multi-scale spatial_shapes with torch.as_tensor of the feature maps' "
    "sizes, which the dynamo exporter can only record as constants (it fixes height and width at the example's)"
)


@dataclass(frozen=True)
class Family:
    """One detector architecture as the importer exports it.

    Attributes:
        architecture: ``config.json``'s ``architectures[0]``, a transformers class name.
        scores: the score rule's name (:data:`service.tasks.detection_scores.RULES`).
        top_k: ``config.json`` -> the rule's ``top_k`` (None: the number of queries).
        default_size: the image processor's ``size`` when its config leaves it out.
        check: refuses a checkpoint that cannot be loaded here (None: none).
    """

    architecture: str
    scores: str
    top_k: Callable[[dict[str, Any]], int | None]
    default_size: dict[str, int]
    check: Callable[[dict[str, Any], Path], None] | None = None

    def task_options(self, config: dict[str, Any]) -> dict[str, Any]:
        """The manifest's ``task_options``: the rule, its ``top_k`` and the box format."""
        top_k = self.top_k(config) if RULES[self.scores].takes_top_k else None
        return {"scores": self.scores, "top_k": top_k, "box_format": "cxcywh"}


_SIGMOID, _SOFTMAX = SigmoidTopK.name, SoftmaxNoObject.name
FAMILIES = (
    Family("YolosForObjectDetection", _SOFTMAX, _num_queries, _SHORTEST_800),
    Family("ConditionalDetrForObjectDetection", _SIGMOID, _top_100, _SHORTEST_800, _refuse_timm("Conditional DETR")),
    Family(
        "DeformableDetrForObjectDetection",
        _SIGMOID,
        _top_100,
        _SHORTEST_800,
        _all(_refuse_timm("Deformable DETR"), _fixed_size_only("Deformable DETR", _DEFORMABLE_SIZES)),
    ),
    Family("RTDetrForObjectDetection", _SIGMOID, _num_queries, _SQUARE_640),
    Family("RTDetrV2ForObjectDetection", _SIGMOID, _num_queries, _SQUARE_640),
    Family("DFineForObjectDetection", _SIGMOID, _num_queries, _SQUARE_640),
    Family("LwDetrForObjectDetection", _SIGMOID, _top_100, _SHORTEST_800),
    Family("RfDetrForObjectDetection", _SIGMOID, _num_queries, _SHORTEST_800),
)


def _symbolic_len(value: Any) -> Any:
    """``len`` that gives a tensor's first size as ``shape[0]`` (a symbolic size while exporting)."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.shape[0]
    return builtins.len(value)


@contextmanager
def exporting(model: PreTrainedModel) -> Iterator[None]:
    """Run the ONNX export of ``model`` with the two work-arounds of this module's docstring, then undo them."""
    modules = {
        sys.modules[type(m).__module__] for m in model.modules() if type(m).__module__.startswith("transformers.")
    }
    previous = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    for module in modules:
        vars(module)["len"] = _symbolic_len  # a module global shadows the builtin in that module's functions
    try:
        yield
    finally:
        for module in modules:
            del vars(module)["len"]
        if previous is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = previous


def head(family: Family) -> _Head:
    """The importer's :class:`export.hf._Head` for ``family``."""
    return _Head(
        detection.TASK.name,
        _Detector,
        ("pred_logits", "pred_boxes"),
        {"logits": "pred_logits", "boxes": "pred_boxes"},
        family.default_size,
        square=False,
        no_object=RULES[family.scores].no_object,
        crop=False,
        task_options=family.task_options,
        check=family.check,
        exporting=exporting,
    )


for _family in FAMILIES:
    register(_family.architecture, head(_family))
