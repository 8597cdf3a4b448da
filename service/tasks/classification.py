"""Classification: a classifier's logits -> the top-k labels with softmax scores.

Route ``POST /v1/models/{name}/classify?top_k=5``; output role ``logits`` (B, num_classes).
``render=png`` draws the attention rollout over the image, for a ViT exported with its
attention maps (the manifest's ``attention``).
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from service.core.errors import InvalidParameter
from service.core.numbers import QueryInt
from service.imaging import attention
from service.tasks.base import BaseTask, decoded, output, outputs, register, result_schema

SMALL = 64  # at most this many classes: softmax and top-k in plain Python (numpy's calls cost more)

if TYPE_CHECKING:
    from service.pipeline.inference import ImageOutcome
    from service.runtime.repository import ModelVersion


def classify(logits: np.ndarray, labels: list[str], top_k: int) -> list[dict[str, Any]]:
    """The ``top_k`` classes of one image, best first.

    Args:
        logits: float array (num_classes,), raw scores for one image.
        labels: class index -> name, ``len(labels) == num_classes``.
        top_k: how many to return, >= 1; clamped to ``num_classes`` (as the Hugging Face
            image-classification pipeline does).

    Returns:
        ``[{"label": str, "class_id": int, "score": float}, ...]``, scores are softmax
        probabilities in [0, 1] (computed in float64), sorted descending; ties keep the lower
        class id first.
    """
    if logits.ndim != 1 or logits.shape[0] != len(labels):
        raise ValueError(f"expected logits ({len(labels)},), got {logits.shape}")
    if len(labels) <= SMALL and (small := _classify_small(logits.tolist(), labels, top_k)) is not None:
        return small
    exp = np.exp(logits.astype(np.float64) - logits.max())  # float64, as the plain-Python path
    probabilities = exp / exp.sum()
    k = min(top_k, len(labels))
    if 0 < k < len(labels) and np.isfinite(probabilities).all():
        order = _top(probabilities, k)
    else:  # every class asked for, or NaN scores (a broken model): the full sort, which orders them as before
        order = np.argsort(-probabilities, kind="stable")[:k]
    return [{"label": labels[i], "class_id": i, "score": float(probabilities[i])} for i in order.tolist()]


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest finite ``scores``, largest first, ties by lower index first.

    What ``np.argsort(-scores, kind="stable")[:k]`` gives, without sorting every class: the k-th
    largest score is found by a partial sort (``np.partition``, linear time), and only the classes
    scoring at least that (k of them, more on a tie) are sorted. For 1,000 classes and k = 5 the
    classification took 47-57 instead of 57-87 µs in a warm loop (the two alternating), on the event
    loop, per image.
    """
    kth = np.partition(scores, scores.size - k)[scores.size - k]
    candidates = np.flatnonzero(scores >= kth)  # ascending, so the stable sort keeps lower ids first on a tie
    return candidates[np.argsort(-scores[candidates], kind="stable")[:k]]


def _classify_small(logits: list[float], labels: list[str], top_k: int) -> list[dict[str, Any]] | None:
    """:func:`classify` in plain Python floats (float64), for a few classes.

    For a handful of classes numpy's per-call dispatch costs more than the arithmetic: 12 against
    5 µs for 10 classes in a warm loop, and on the event loop, its caches cold after a model run,
    py-spy put 19 % of the loop's samples for ``vit-digits`` at concurrency 1 in the numpy version
    (``python -m bench.profile --model ... --concurrency 1 --rate 250``; unsampled runs showed a
    smaller gain, within their noise). From 100 classes on numpy is the faster.
    ``heapq.nlargest`` is ``sorted(..., reverse=True)[:k]``, stable: ties keep the lower class id first.
    None for logits that are not all finite (NaN, infinities), which numpy's path answers as before.
    """
    top = max(logits)
    exp = [math.exp(value - top) for value in logits]
    total = math.fsum(exp)
    if not math.isfinite(total):  # a NaN, or an infinity (inf - inf): heapq would order NaNs by chance
        return None
    order = heapq.nlargest(top_k, range(len(exp)), key=exp.__getitem__)
    return [{"label": labels[i], "class_id": i, "score": exp[i] / total} for i in order]


class ClassifyParams(BaseModel):
    """``classify``'s query parameters."""

    top_k: QueryInt = Field(5, ge=1, description="How many classes to return; clamped to the label count")
    render: Literal["json", "png"] | None = Field(
        None,
        description="png: the attention-rollout heat map over the image (a ViT with attention maps; one image)",
    )


_PREDICTIONS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["label", "class_id", "score"],
        "properties": {
            "label": {"type": "string"},
            "class_id": {"type": "integer", "minimum": 0},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
    },
}


class Classification(BaseTask[ClassifyParams]):
    """Image classification: the top-k classes of each image (:func:`classify`)."""

    name = "classification"
    verb = "classify"
    summary = "Classify one or more images"
    roles = ("logits",)
    Params = ClassifyParams
    result_schema = result_schema("Classification", {"predictions": _PREDICTIONS})
    picture_help = "the attention-rollout heat map over the image (a ViT exported with attention maps)"

    def fields(self, model: ModelVersion, outcome: ImageOutcome, params: ClassifyParams) -> dict[str, Any]:
        """``{"predictions": [...]}``: :func:`classify` of the ``logits`` row."""
        return {"predictions": classify(output(model, outcome, "logits"), model.manifest.labels, params.top_k)}

    def draws(self, model: ModelVersion) -> bool:
        """A model with attention maps (rollout) or per-token class scores (class activation map)."""
        return model.manifest.attention is not None or model.manifest.class_maps is not None

    def picture(
        self, model: ModelVersion, outcome: ImageOutcome, fields: dict[str, Any], params: ClassifyParams
    ) -> bytes:
        """The attention rollout over the displayed image, captioned with the top class.

        A model without attention maps but with per-token class scores (the manifest's
        ``class_maps``: Swin) draws the top class's activation map (Zhou et al. 2016) instead.

        Raises:
            InvalidParameter: the graph exports neither (422), with the manifest's reason.
        """
        spec, image, top = model.manifest.attention, decoded(outcome), fields["predictions"][0]
        assert image.image is not None  # render=png keeps the picture
        caption = f"{top['label']} {top['score']:.2f}"
        maps = model.manifest.class_maps
        if spec is None and maps is not None:  # no attention to roll out (Swin): the top class's activation map
            heat = attention.class_map(
                outputs(outcome)[maps.output], (maps.grid.height, maps.grid.width), top["class_id"]
            )
            size = (image.width, image.height)
            return attention.render_heat_png(image.image, size, heat, model.preprocessor, caption=caption)
        if spec is None:
            reason = model.manifest.no_attention_reason
            raise InvalidParameter(
                f"model {model.name!r} version {model.version} exports no attention maps"
                + (f" ({reason})" if reason else "")
                + ", so render=png has nothing to draw; ask for JSON, or use a ViT exported with them "
                "(e.g. vit-cifar10)"
            )
        return attention.render_png(
            image.image,
            (image.width, image.height),
            outputs(outcome)[spec.output],
            (spec.grid.height, spec.grid.width),
            model.preprocessor,
            caption=caption,
            prefix_tokens=spec.prefix_tokens,
        )


TASK = register(Classification())
