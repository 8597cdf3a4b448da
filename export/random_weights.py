"""A named ViT config, or DETR-R50, with random weights -> ``model.onnx`` + ``model.json``, for benchmarks.

    python -m export random vit-ti16 --to bench/.work/model_repository/vit-ti16-random/1
    python -m export random detr-r50 --to bench/.work/model_repository/detr-r50-random/1

The graph has the architecture and cost of the real model (ViT-Ti/16 at 224: 5.7 M
parameters, 1.26 GFLOPs per image) and predicts nothing useful: its manifest says so
(``provenance.training_data``), has no metrics, and must never be committed or served as a
model. The export goes through the same path as a trained checkpoint (dynamo exporter,
``onnx.checker``, parity with PyTorch at batch 1 and 7).
"""

from __future__ import annotations

from pathlib import Path

import torch

from export.onnx_export import export_info, export_onnx, parity
from models import detr
from models.vit import CONFIGS, build
from service.imaging.spec import Preprocessing
from service.runtime.manifest import SCHEMA_VERSION, Manifest, Provenance, TensorSpec, write_manifest
from service.tasks import classification, detection

# The Hugging Face ViTImageProcessor's defaults (google/vit-base-patch16-224): stretch, bilinear, mean = std = 0.5.
HF_VIT_MEAN = HF_VIT_STD = [0.5, 0.5, 0.5]
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # DETR's normalisation


def export_random(config: str, out: Path, *, num_classes: int = 1000, seed: int = 0, opset: int) -> Manifest:
    """Export ``models.vit.CONFIGS[config]`` with random (seeded, timm-style) weights.

    Args:
        config: a ViT config name, e.g. "vit-ti16" or "vit-b16", or "detr-r50" (the paper's
            DETR-R50, ``models.detr.CONFIGS``: a detector at a fixed 800x800, stretched,
            outputs ``pred_logits`` and ``pred_boxes``; ``num_classes`` is ignored: COCO's 91).
        out: the model version folder to write (``<repository>/<name>/<version>``).
        num_classes: outputs of the head; labels are "class_0" ... .
        seed: torch's seed for the initialisation and the parity inputs.
        opset: ONNX opset.

    Returns:
        The manifest written beside the graph.

    Raises:
        ValueError: an unknown config name.
        ParityError: ONNX Runtime and PyTorch differ by more than 1e-4.
    """
    if config == "detr-r50":
        return _export_random_detr(out, seed=seed, opset=opset)
    if config not in CONFIGS:
        raise ValueError(f"unknown ViT config {config!r}; known: {sorted(CONFIGS)} and detr-r50")
    torch.manual_seed(seed)
    model = build(config, num_classes=num_classes).eval()
    c, size = model.config.in_channels, model.config.image_size
    inputs = torch.randn(7, c, size, size)  # (7, C, H, W), roughly the scale of normalised pixels
    path = out / "model.onnx"
    export_onnx(model, inputs[:2], path, output_names=("logits",), opset=opset)
    diffs = parity(model, path, [inputs[:1], inputs])
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=classification.TASK.name,
        description=f"{config} ({model.config.hidden_size} wide, {model.config.depth} blocks, "
        f"{model.config.patch_size}x{model.config.patch_size} patches, {size}x{size}) with RANDOM weights: "
        "for benchmarks only, its predictions mean nothing",
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, size, size]),
        outputs=["logits"],
        preprocessing=Preprocessing(
            color_mode="RGB" if c == 3 else "L",
            size={"height": size, "width": size},
            interpolation="bilinear",
            mean=HF_VIT_MEAN[:c],
            std=HF_VIT_STD[:c],
        ),
        labels=[f"class_{i}" for i in range(num_classes)],
        provenance=_provenance(config, out, "timm-style", seed, opset, diffs),
    )
    write_manifest(manifest, out / "model.json")
    return manifest


def _export_random_detr(out: Path, *, seed: int, opset: int) -> Manifest:
    torch.manual_seed(seed)
    model = detr.build("detr-r50")
    graph, config = detr.DETRForExport(model).eval(), model.config
    height, width = config.image_size
    inputs = torch.randn(2, 3, height, width)  # (B, 3, H, W)
    path = out / "model.onnx"
    export_onnx(graph, inputs, path, output_names=("pred_logits", "pred_boxes"), opset=opset)
    diffs = parity(graph, path, [inputs[:1], inputs])
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=detection.TASK.name,
        description=f"DETR-R50 (ResNet-50, d=256, 6+6 layers, {config.num_queries} queries, {height}x{width}) "
        "with RANDOM weights: for benchmarks only, its detections mean nothing",
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", 3, height, width]),
        outputs=["pred_logits", "pred_boxes"],
        roles={"logits": "pred_logits", "boxes": "pred_boxes"},
        preprocessing=Preprocessing(
            color_mode="RGB",
            size={"height": height, "width": width},
            interpolation="bilinear",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
        ),
        labels=[f"class_{i}" for i in range(config.num_classes)] + ["no-object"],
        provenance=_provenance("detr-r50", out, "PyTorch's default", seed, opset, diffs),
    )
    write_manifest(manifest, out / "model.json")
    return manifest


def _provenance(config: str, out: Path, init: str, seed: int, opset: int, diffs: dict[str, float]) -> Provenance:
    """A random-weight graph's provenance: no training data, no metrics, never to be served."""
    return Provenance(
        training_data=f"none: random weights ({init} initialisation, torch seed {seed})",
        recipe=f"python -m export random {config} --to {out} --seed {seed}",
        metrics={},
        export=export_info(opset, diffs),
        notes="Built by bench/ to measure serving speed; never commit or serve it as a model.",
    )
