"""DETR checkpoint (written by ``models/train_detr.py``) -> ``model.onnx`` + ``model.json``.

The graph maps ``pixel_values`` (B, C, H, W) to ``pred_logits`` (B, N, num_classes + 1) and
``pred_boxes`` (B, N, 4) normalised (cx, cy, w, h): raw outputs, no post-processing in the
graph. The batch axis is symbolic; H and W are fixed, as the letterbox preprocessing always
produces the model's input size. Parity is measured on real test canvases at batch sizes 1
and 7; the test AP is measured on the whole test split through ONNX Runtime with the server's
own preprocessing and post-processing, so it is the AP served over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.onnx_export import export_info, export_onnx, parity
from models.detection_data import load_split, to_coco
from models.detection_eval import RunFn, coco_ap, detect_images
from models.detr import DETR, DETRForExport, config_from_dict
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from service.runtime.manifest import SCHEMA_VERSION, Manifest, Provenance, TensorSpec, write_manifest
from service.tasks import detection

OUTPUT_NAMES = ("pred_logits", "pred_boxes")


def onnx_runner(path: Path) -> RunFn:
    """The graph at ``path`` as a :data:`models.detection_eval.RunFn` (ONNX Runtime, CPU)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def run(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, boxes = session.run(list(OUTPUT_NAMES), {input_name: batch})
        return logits, boxes

    return run


def export_detr(checkpoint: dict[str, Any], out: Path, *, opset: int) -> Manifest:
    """Export a DETR checkpoint dict and write its manifest.

    Raises:
        ParityError: ONNX Runtime and PyTorch differ by more than 1e-4.
    """
    config = config_from_dict(checkpoint["config"])
    model = DETR(config)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    graph = DETRForExport(model).eval()

    preprocessing = Preprocessing.model_validate(checkpoint["preprocessing"])
    preprocess = Preprocessor(preprocessing)
    test = load_split("test", None, checkpoint["split_sizes"]["test"])
    from PIL import Image

    inputs = torch.from_numpy(np.stack([preprocess(Image.fromarray(c.image)) for c in test[:7]]))  # (7, C, H, W)
    path = out / "model.onnx"
    export_onnx(graph, inputs[:2], path, output_names=OUTPUT_NAMES, opset=opset)
    diffs = parity(graph, path, [inputs[:1], inputs])

    labels = checkpoint["labels"]
    detections = detect_images(onnx_runner(path), [c.image for c in test], preprocessing, labels)
    onnx_ap = coco_ap(to_coco(test), detections)
    trained = checkpoint["metrics"]

    c, h, w = preprocess.output_shape
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=detection.TASK.name,
        description=(
            f"DETR ({config.backbone} backbone, d={config.hidden_size}, {config.num_encoder_layers}+"
            f"{config.num_decoder_layers} layers, {config.num_queries} queries) trained on {checkpoint['dataset']}"
        ),
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, h, w]),
        outputs=list(OUTPUT_NAMES),
        roles=dict(zip(detection.TASK.roles, OUTPUT_NAMES, strict=True)),
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
                "test_images": float(len(test)),
                "test_objects": float(sum(len(canvas.labels) for canvas in test)),
                "train_seconds": trained["train_seconds"],
                "train_cpu_seconds": trained["train_cpu_seconds"],
            },
            export=export_info(opset, diffs),
            notes=(
                f"Resize policy: letterbox to {w}x{h} (keep the aspect ratio, pad bottom and right with "
                f"{preprocessing.pad_value}); pred_boxes are normalised cxcywh in that padded frame. "
                "COCO AP (pycocotools) with every query kept (threshold 0), boxes in canvas pixels."
            ),
        ),
    )
    write_manifest(manifest, out / "model.json")
    return manifest
