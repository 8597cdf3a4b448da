"""Detection: a set predictor's output read directly (no NMS), and the detections drawn on the image.

Route ``POST /v1/models/{name}/detect?threshold=0.5&max_detections=100``; output roles
``logits`` (B, Q, C) and ``boxes`` (B, Q, 4), normalised (cx, cy, w, h) of the model input.
The post-processing's variant is the manifest's ``task_options``: ``scores`` names a rule of
:mod:`service.tasks.detection_scores` (``"softmax"``, DETR's and YOLOS's, with C = classes + the
no-object class last; the default, so manifests without ``task_options`` keep DETR's reading; or
``"sigmoid_top_k"``, the focal-loss detectors', C = classes) and ``top_k`` its candidate count.

The picture (``render=png``) is the image as the client displays it (EXIF orientation applied,
full size), in the colour mode the model reads, with each detection's box outlined and its
label and score written in a filled tag at the box's top-left corner (above the box where
there is room). Lower scores are drawn first, so the best detection is on top where boxes
overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.core.numbers import QueryFloat, QueryInt
from service.imaging import resize
from service.imaging.render import bounded_font_size, displayed_canvas, png_bytes, scale_of
from service.tasks.base import BaseTask, decoded, options, output, register, result_schema
from service.tasks.detection_scores import RULES

if TYPE_CHECKING:
    from service.pipeline.inference import ImageOutcome
    from service.runtime.manifest import Manifest
    from service.runtime.repository import ModelVersion


def detect(
    logits: np.ndarray,
    boxes: np.ndarray,
    labels: list[str],
    *,
    threshold: float,
    max_detections: int,
    box_scale: tuple[float, float],
    image_size: tuple[int, int],
    scores: str = "softmax",
    top_k: int | None = None,
) -> list[dict[str, Any]]:
    """A set predictor's detections for one image, read directly: no NMS, no matching.

    The score rule ``scores`` (:data:`service.tasks.detection_scores.RULES`) turns the class
    logits into (query, class, score) candidates, best first: ``"softmax"`` is DETR's
    ``PostProcess`` (each query's best class other than "no object", the last column);
    ``"sigmoid_top_k"`` the ``top_k`` best (query, class) pairs by sigmoid, as Deformable DETR's,
    RT-DETR's and their successors' processors take them. Candidates scoring at least
    ``threshold`` are kept, at most ``max_detections``, each with its query's box.

    Args:
        logits: float (num_queries, C) raw class scores: C = ``len(labels)``, "no object" last
            for a rule with a no-object class.
        boxes: float (num_queries, 4) boxes (cx, cy, w, h) normalised to [0, 1] of the model's
            input frame.
        labels: class index -> name (with "no object" last for such a rule).
        threshold: the lowest score kept, in [0, 1].
        max_detections: the most detections returned, >= 1 (the best ones).
        box_scale: (sx, sy), pixels of the displayed image per unit of normalised input
            coordinate (:meth:`service.imaging.preprocess.Preprocessor.box_scale`).
        image_size: (width, height) of the displayed image; boxes are clipped to it.
        scores: the score rule's name.
        top_k: the rule's candidate count (None: its default; unused by ``"softmax"``).

    Returns:
        ``[{"label", "class_id", "score", "box": {"xmin", "ymin", "xmax", "ymax"}}, ...]``,
        boxes in pixels of the displayed image (x right, y down, edges), sorted by score
        descending (ties keep the lower query index, then class index, first).

    Raises:
        ValueError: shapes that do not match the labels, or an unknown rule.
    """
    if logits.ndim != 2 or logits.shape[1] != len(labels) or boxes.shape != (logits.shape[0], 4):
        raise ValueError(f"expected logits (Q, {len(labels)}) and boxes (Q, 4), got {logits.shape} and {boxes.shape}")
    if scores not in RULES:
        raise ValueError(f"unknown score rule {scores!r}; known: {', '.join(RULES)}")
    queries, class_ids, kept = RULES[scores].select(
        logits, threshold=threshold, max_detections=max_detections, top_k=top_k
    )  # each (K,)

    cx, cy, w, h = boxes[queries].astype(np.float64).T  # each (K,): the candidates' query boxes
    sx, sy = box_scale
    width, height = image_size
    xmin = np.clip((cx - w / 2) * sx, 0, width)
    ymin = np.clip((cy - h / 2) * sy, 0, height)
    xmax = np.clip((cx + w / 2) * sx, 0, width)
    ymax = np.clip((cy + h / 2) * sy, 0, height)
    return [
        {
            "label": labels[c],
            "class_id": int(c),
            "score": float(s),
            "box": {"xmin": float(x0), "ymin": float(y0), "xmax": float(x1), "ymax": float(y1)},
        }
        for c, s, x0, y0, x1, y1 in zip(class_ids, kept, xmin, ymin, xmax, ymax, strict=True)
    ]


# Distinct colours (Tableau 10), one per class id, cycling.
PALETTE = [
    (78, 121, 167),
    (242, 142, 43),
    (225, 87, 89),
    (118, 183, 178),
    (89, 161, 79),
    (237, 201, 72),
    (176, 122, 161),
    (255, 157, 167),
    (156, 117, 95),
    (186, 176, 172),
]


def line_width(width: int, height: int) -> int:
    """Outline width in pixels: 1 px per 256 px of the image's longer side, at least 1."""
    return max(1, round(max(width, height) / 256))


def font_size(width: int, height: int) -> int:
    """Label text size in pixels for a picture of ``width`` x ``height``: 10 px, larger for
    pictures over 400 px (a 40th of the longer side), at most a quarter of the shorter side
    (:func:`~service.imaging.render.bounded_font_size`)."""
    return bounded_font_size(round(max(width, height) / 40), width, height)


def draw_detections(image: Image.Image, detections: Sequence[dict[str, Any]], size: tuple[int, int]) -> Image.Image:
    """Draw ``detections`` on ``image`` shown at ``size``.

    Args:
        image: the decoded image (EXIF orientation applied), any mode; resized to ``size``
            when it was decoded smaller (a JPEG in draft mode).
        detections: :func:`detect`'s list, boxes in pixels of ``size``.
        size: (width, height) of the displayed image, in pixels.

    Returns:
        A new RGB image of ``size``, scaled down to :data:`~service.imaging.render.MAX_PICTURE_PIXELS`
        when larger (the boxes with it).
    """
    canvas = displayed_canvas(image, size)
    sx, sy = scale_of(canvas, size)
    width, height = canvas.size
    stroke = line_width(width, height)
    font = ImageFont.load_default(size=font_size(width, height))
    draw = ImageDraw.Draw(canvas)
    for det in sorted(detections, key=lambda d: d["score"]):
        colour = PALETTE[det["class_id"] % len(PALETTE)]
        box = det["box"]
        x0, y0 = round(box["xmin"] * sx), round(box["ymin"] * sy)
        x1, y1 = max(x0, round(box["xmax"] * sx) - 1), max(y0, round(box["ymax"] * sy) - 1)  # edges -> last pixel
        draw.rectangle((x0, y0, x1, y1), outline=colour, width=stroke)
        text = f"{det['label']} {det['score']:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tag_w, tag_h = right - left + 2, bottom - top + 2
        tag_y = y0 - tag_h if y0 - tag_h >= 0 else y0  # above the box, else inside it
        draw.rectangle((x0, tag_y, x0 + tag_w - 1, tag_y + tag_h - 1), fill=colour)
        draw.text((x0 + 1 - left, tag_y + 1 - top), text, fill=(0, 0, 0), font=font)
    return canvas


DEFAULT_THRESHOLD = 0.5  # detect's default lowest score; the manifest's set-quality metrics are taken at it


class DetectParams(BaseModel):
    """``detect``'s query parameters."""

    threshold: QueryFloat = Field(
        DEFAULT_THRESHOLD, ge=0, le=1, allow_inf_nan=False, description="Lowest score returned"
    )
    max_detections: QueryInt = Field(
        100, ge=1, description="Most detections returned, best first; clamped to the number of queries"
    )
    render: Literal["json", "png"] | None = Field(
        None, description="png: the image with its detections drawn (one image only)"
    )


class DetectOptions(BaseModel):
    """The manifest's ``task_options`` for a detector: which post-processing its outputs need.

    The defaults are DETR's reading, so a manifest without ``task_options`` keeps it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scores: str = Field(
        "softmax",
        description="the score rule (service.tasks.detection_scores): 'softmax' over classes with the no-object "
        "class last (DETR, YOLOS), or 'sigmoid_top_k', a sigmoid per (query, class) and the top_k best pairs "
        "(Deformable/Conditional DETR, RT-DETR, D-FINE, LW-DETR, RF-DETR)",
    )
    top_k: int | None = Field(
        None, ge=1, description="sigmoid_top_k: candidates over queries x classes (None: the number of queries)"
    )
    box_format: Literal["cxcywh"] = Field(
        "cxcywh", description="the boxes output: (cx, cy, w, h) normalised to [0, 1] of the model input"
    )

    @model_validator(mode="after")
    def _known_rule(self) -> DetectOptions:
        if self.scores not in RULES:
            raise ValueError(f"scores {self.scores!r} is not a score rule; known: {', '.join(RULES)}")
        if self.top_k is not None and not RULES[self.scores].takes_top_k:
            raise ValueError(f"scores {self.scores!r} takes no top_k")
        return self


_PIXELS = {"type": "number", "minimum": 0, "description": "pixels of the displayed image"}
_DETECTIONS = {
    "type": "array",
    "description": "The set prediction read directly (no NMS), by the manifest's score rule, best score first.",
    "items": {
        "type": "object",
        "required": ["label", "class_id", "score", "box"],
        "properties": {
            "label": {"type": "string"},
            "class_id": {"type": "integer", "minimum": 0},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "box": {
                "type": "object",
                "required": ["xmin", "ymin", "xmax", "ymax"],
                "properties": {"xmin": _PIXELS, "ymin": _PIXELS, "xmax": _PIXELS, "ymax": _PIXELS},
            },
        },
    },
}


def _options(manifest: Manifest) -> DetectOptions:
    """A detector's ``task_options``: :class:`DetectOptions`, the detection task's ``Options``."""
    rule = options(manifest)
    assert isinstance(rule, DetectOptions)
    return rule


class Detection(BaseTask[DetectParams]):
    """Object detection with a set predictor (DETR): :func:`detect`, boxes in displayed pixels."""

    name = "detection"
    verb = "detect"
    summary = "Detect objects in one or more images"
    roles = ("logits", "boxes")
    Params = DetectParams
    Options = DetectOptions
    result_schema = result_schema("Detection", {"detections": _DETECTIONS})
    picture_help = "the image with its detections drawn"

    def check_manifest(self, manifest: Manifest) -> None:
        """A detector takes no crop (boxes map back through the whole input frame); no-object needs its label.

        Raises:
            ValueError: a cropping resize policy (``center_crop``) or ``crop_size``, or a score rule with a
                no-object class and fewer than 2 labels.
        """
        if resize.get(manifest.preprocessing.resize).crops or manifest.preprocessing.crop_size:
            raise ValueError("a detector's preprocessing takes no crop (center_crop or crop_size)")
        rule = RULES[_options(manifest).scores]
        if rule.no_object and len(manifest.labels) < 2:
            raise ValueError(f"scores {rule.name!r} needs the classes and the no-object class last in labels")

    def fields(self, model: ModelVersion, outcome: ImageOutcome, params: DetectParams) -> dict[str, Any]:
        """``{"detections": [...]}`` in pixels of the image as displayed (EXIF applied), clipped to it."""
        image = decoded(outcome)
        displayed = (image.width, image.height)
        rule = _options(model.manifest)
        detections = detect(
            output(model, outcome, "logits"),
            output(model, outcome, "boxes"),
            model.manifest.labels,
            threshold=params.threshold,
            max_detections=params.max_detections,
            box_scale=model.preprocessor.box_scale(image.size, displayed),
            image_size=displayed,
            scores=rule.scores,
            top_k=rule.top_k,
        )
        return {"detections": detections}

    def picture(
        self, model: ModelVersion, outcome: ImageOutcome, fields: dict[str, Any], params: DetectParams
    ) -> bytes:
        """The displayed image with ``fields["detections"]`` drawn, as PNG."""
        image = decoded(outcome)
        assert image.image is not None  # render=png keeps the picture
        return png_bytes(draw_detections(image.image, fields["detections"], (image.width, image.height)))


TASK = register(Detection())
