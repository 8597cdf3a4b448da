"""DETR checkpoint (written by ``models/train_detr.py``) -> ``model.onnx`` + ``model.json``.

The graph maps ``pixel_values`` (B, C, H, W) to ``pred_logits`` (B, N, num_classes [+ 1]) and
``pred_boxes`` (B, N, 4) normalised (cx, cy, w, h): raw outputs, no post-processing in the
graph. The batch axis is symbolic. Two input forms, as the checkpoint says (``pixel_mask``):

* letterbox (no mask): H and W fixed, the letterbox preprocessing always produces the model's
  input size; boxes are relative to that padded frame.
* bucketed (``pixel_mask``; issue 18): a second input ``pixel_mask`` (B, H, W) int64, H and W
  dynamic; the served preprocessing is the training's resize (``fit``, or ``shortest_edge`` for
  the ``resized-bucket`` inputs) with padding :func:`serving_buckets`; boxes are relative to each
  unpadded image.

``postprocess`` ``"sigmoid"`` (the focal classification loss) is served by the
``sigmoid_top_k`` score rule with ``top_k`` 100, as the training's evaluation reads it; the
labels then have no "no object" class. Parity is measured on real test canvases at batch sizes
1 and 7 (bucketed: padded batches with their masks); the test AP is measured on the whole test
split through ONNX Runtime with the server's own preprocessing, batching by bucket and
post-processing, so it is the AP served over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.hf import pad_to_bucket
from export.onnx_export import export_info, export_onnx, parity
from models.detection_data import load_split, to_coco
from models.detection_eval import RunFn, coco_ap, detect_images, set_quality
from models.detr import DETR, DETRForExport, config_from_dict
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from service.runtime.manifest import SCHEMA_VERSION, Manifest, Provenance, TensorSpec, write_manifest
from service.tasks import detection
from service.tasks.detection_scores import SigmoidTopK

OUTPUT_NAMES = ("pred_logits", "pred_boxes")
MASK_NAME = "pixel_mask"
SIGMOID_TOP_K = 100  # (query, class) pairs kept before the threshold: models.detection_eval.sigmoid_detect's


def onnx_runner(path: Path) -> RunFn:
    """The graph at ``path`` as a :data:`models.detection_eval.RunFn` (ONNX Runtime, CPU).

    A graph with a pixel mask takes ``run(batch, mask)``; without a mask it runs all ones.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(batch: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        feed = {names[0]: batch}
        if len(names) > 1:
            feed[names[1]] = mask if mask is not None else np.ones((batch.shape[0], *batch.shape[2:]), np.int64)
        logits, boxes = session.run(list(OUTPUT_NAMES), feed)
        return logits, boxes

    return run


def serving_buckets(longest_edge: int, pad_to: str, *, every_longest: bool = False) -> list[dict[str, int]]:
    """The padding buckets (H, W) a bucketed checkpoint is served with, smallest first.

    ``pad_to`` ``"max"`` (trained on one padded square): that square. ``"bucket"``: the sides
    3/4 of ``longest_edge`` and all of it, in the four combinations (at 128: 96x96, 96x128, 128x96,
    128x128). Trained on finer buckets (sides in steps of 16), the model sees more padding in
    these: its mask keeps the attention off it, but the backbone's convolutions see it, and the
    test AP below, measured with these buckets, is lower than the training's (``resized``: 0.615
    against 0.686). The ``resized-served`` input format trains on these buckets themselves.
    ``every_longest``: every image's longer side is resized to ``longest_edge`` (give or take the
    pixel the Hugging Face arithmetic truncates), so no image fits the small square, which is left
    out (it would only cost warm-up).
    """
    if pad_to == "max":
        return [{"height": longest_edge, "width": longest_edge}]
    sides = [longest_edge * 3 // 4, longest_edge]
    buckets = [{"height": h, "width": w} for h in sides for w in sides]
    if every_longest:
        buckets = [b for b in buckets if max(b["height"], b["width"]) == longest_edge]
    return sorted(buckets, key=lambda b: (b["height"] * b["width"], b["height"]))


def served_preprocessing(checkpoint: dict[str, Any]) -> Preprocessing:
    """The manifest's preprocessing for a checkpoint: its own (letterbox), or with buckets (masked).

    A masked checkpoint records the server's resize policy that computes its training resize
    (``models.detr_inputs.InputFormat.preprocessing``): ``fit`` (only a larger image shrinks;
    recorded as ``"pad"`` before the ``resized-bucket`` format came) or ``shortest_edge`` with
    ``shortest_edge = longest_edge`` (every image's longer side becomes that edge).
    """
    spec = dict(checkpoint["preprocessing"])
    if not checkpoint.get("pixel_mask"):
        return Preprocessing.model_validate(spec)
    kept = ("color_mode", "interpolation", "scale", "mean", "std", "background", "resize", "shortest_edge")
    served = {k: spec[k] for k in kept if k in spec}
    if served.get("resize") == "pad":
        served["resize"] = "fit"  # the record's old name for it
    longest = spec["longest_edge"]
    return Preprocessing.model_validate(
        {
            **served,
            "longest_edge": longest,
            "buckets": serving_buckets(
                longest, spec.get("pad_to", "bucket"), every_longest=spec.get("shortest_edge") == longest
            ),
        }
    )


def _parity_inputs(
    preprocess: Preprocessor, images: list[np.ndarray], masked: bool
) -> list[torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """Batch 1 and batch 7 of test canvases; bucketed: each padded to the largest bucket with its mask."""
    from PIL import Image

    inputs = [preprocess(Image.fromarray(image)) for image in images[:7]]
    if not masked:
        stacked = torch.from_numpy(np.stack(inputs))  # (7, C, H, W)
        return [stacked[:1], stacked]
    buckets = preprocess.spec.buckets or []
    values, masks = pad_to_bucket(inputs, (buckets[-1].height, buckets[-1].width))  # the last holds every canvas
    return [(values[:1], masks[:1]), (values, masks)]


def export_detr(checkpoint: dict[str, Any], out: Path, *, opset: int) -> Manifest:
    """Export a DETR checkpoint dict and write its manifest.

    Raises:
        ParityError: ONNX Runtime and PyTorch differ by more than 1e-4.
    """
    config = config_from_dict(checkpoint["config"])
    model = DETR(config)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    masked = bool(checkpoint.get("pixel_mask"))
    postprocess = checkpoint.get("postprocess", "softmax")
    graph = DETRForExport(model, mask=masked).eval()

    preprocessing = served_preprocessing(checkpoint)
    preprocess = Preprocessor(preprocessing)
    test = load_split("test", None, checkpoint["split_sizes"]["test"])
    batches = _parity_inputs(preprocess, [c.image for c in test], masked)
    path = out / "model.onnx"
    example = batches[-1]
    if isinstance(example, tuple):
        export_onnx(graph, example[0][:2], path, output_names=OUTPUT_NAMES, mask=example[1][:2], opset=opset)
    else:
        export_onnx(graph, example[:2], path, output_names=OUTPUT_NAMES, opset=opset)
    diffs = parity(graph, path, batches)

    labels = checkpoint["labels"]
    detections = detect_images(
        onnx_runner(path), [c.image for c in test], preprocessing, labels, postprocess=postprocess
    )
    onnx_ap = coco_ap(to_coco(test), detections)
    # What users see at the detect route's default threshold (issue 21): doubles, precision, recall.
    quality = set_quality(to_coco(test), detections, threshold=detection.DEFAULT_THRESHOLD)
    trained = checkpoint["metrics"]

    c, h, w = preprocess.output_shape
    hw: list[int | str] = ["height", "width"] if masked else [h, w]
    task_options: dict[str, Any] | None = None  # softmax with "no object" last: the detection task's default
    if postprocess == "sigmoid":
        task_options = {"scores": SigmoidTopK.name, "top_k": SIGMOID_TOP_K, "box_format": "cxcywh"}
    if masked:
        resize = f"{preprocessing.resize} (longest_edge {preprocessing.longest_edge}" + (
            f", shortest_edge {preprocessing.shortest_edge})" if preprocessing.shortest_edge else ", never enlarged)"
        )
        frame = (
            f"Resize policy: {resize}, then "
            f"padded bottom and right to the first bucket that holds it ({len(preprocessing.buckets or [])} buckets) "
            "with pixel_mask; pred_boxes are normalised cxcywh of the unpadded image."
        )
    else:
        frame = (
            f"Resize policy: letterbox to {w}x{h} (keep the aspect ratio, pad bottom and right with "
            f"{preprocessing.pad_value}); pred_boxes are normalised cxcywh in that padded frame."
        )
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=detection.TASK.name,
        description=(
            f"DETR ({config.backbone} backbone, d={config.hidden_size}, {config.num_encoder_layers}+"
            f"{config.num_decoder_layers} layers, {config.num_queries} queries) trained on {checkpoint['dataset']}"
        ),
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, *hw]),
        pixel_mask=MASK_NAME if masked else None,
        outputs=list(OUTPUT_NAMES),
        roles=dict(zip(detection.TASK.roles, OUTPUT_NAMES, strict=True)),
        task_options=task_options,
        preprocessing=preprocessing,
        labels=labels,
        provenance=Provenance(
            training_data=checkpoint["training_data"],
            recipe=checkpoint["recipe"],
            metrics={
                "test_AP": onnx_ap["AP"],
                "test_AP50": onnx_ap["AP50"],
                "test_AP75": onnx_ap["AP75"],
                "test_AR100": onnx_ap["AR100"],
                "test_AP_pytorch": trained["test_AP"],
                "test_AP50_pytorch": trained["test_AP50"],
                "test_duplicate_canvas_fraction": quality["duplicate_canvas_fraction"],
                "test_duplicate_pairs": quality["duplicate_pairs"],
                "test_precision": quality["precision"],
                "test_recall": quality["recall"],
                "test_missed": quality["missed"],
                "test_missed_scored_below_threshold": quality["missed_scored_below_threshold"],
                "set_quality_threshold": detection.DEFAULT_THRESHOLD,
                "test_images": float(len(test)),
                "test_objects": float(sum(len(canvas.labels) for canvas in test)),
                "train_seconds": trained["train_seconds"],
                "train_cpu_seconds": trained["train_cpu_seconds"],
            },
            export=export_info(opset, diffs),
            notes=frame + " COCO AP (pycocotools) with every query kept (threshold 0), boxes in canvas pixels; "
            f"duplicates (same label, IoU > 0.5: models.detection_eval.set_quality), precision and recall at the "
            f"detect route's default threshold {detection.DEFAULT_THRESHOLD}, through ONNX Runtime."
            + (f" Trained on {trained['device']}." if "device" in trained else ""),
        ),
    )
    write_manifest(manifest, out / "model.json")
    return manifest
