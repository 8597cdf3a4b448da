"""Checkpoint (written by ``models/``) -> ``model.onnx`` + ``model.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export import evaluate
from export.onnx_export import export_onnx, parity
from models.datasets import load_digits_splits
from models.vit import ViT, ViTConfig
from service.manifest import SCHEMA_VERSION, ExportInfo, Manifest, Preprocessing, Provenance, TensorSpec, write_manifest
from service.preprocess import Preprocessor


def _test_split(dataset: str):
    if dataset == "digits":
        return load_digits_splits()[1]
    raise ValueError(f"no test split known for dataset {dataset!r}")


def export_checkpoint(checkpoint_path: Path, out: Path, *, opset: int) -> Manifest:
    """Export a classifier checkpoint and write its manifest (a DETR checkpoint goes to :mod:`export.detr`).

    Parity is measured on real test images at batch sizes 1 and 7; the test accuracy is
    measured on the whole test split through ONNX Runtime with the server's preprocessing.

    Raises:
        ParityError: ONNX Runtime and PyTorch differ by more than 1e-4.
        ValueError: an architecture or dataset this exporter does not know.
    """
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if checkpoint["architecture"] == "detr":
        from export.detr import export_detr

        return export_detr(checkpoint, out, opset=opset)
    if checkpoint["architecture"] != "vit":
        raise ValueError(f"unknown architecture {checkpoint['architecture']!r}")
    model = ViT(ViTConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()

    preprocessing = Preprocessing.model_validate(checkpoint["preprocessing"])
    test = _test_split(checkpoint["dataset"])
    preprocess = Preprocessor(preprocessing)
    inputs = torch.from_numpy(np.stack([preprocess(evaluate.pil_image(p)) for p in test.images[:7]]))  # (7, C, H, W)
    path = out / "model.onnx"
    export_onnx(model, inputs[:2], path, output_names=("logits",), opset=opset)
    diffs = parity(model, path, [inputs[:1], inputs])
    onnx_accuracy = evaluate.accuracy(path, preprocessing, test)

    c, h, w = preprocess.output_shape
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task="classification",
        description=f"ViT ({model.config.hidden_size} wide, {model.config.depth} blocks, "
        f"{model.config.patch_size}x{model.config.patch_size} patches) trained on {checkpoint['dataset']}",
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, h, w]),
        outputs=["logits"],
        preprocessing=preprocessing,
        labels=checkpoint["labels"],
        provenance=Provenance(
            training_data=checkpoint["training_data"],
            recipe=checkpoint["recipe"],
            metrics={
                "test_accuracy": onnx_accuracy,
                "test_accuracy_pytorch": checkpoint["metrics"]["test_accuracy"],
                "test_images": float(len(test.labels)),
                "train_seconds": checkpoint["metrics"]["train_seconds"],
            },
            export=ExportInfo(
                exporter="torch.onnx.export(dynamo=True)",
                opset=opset,
                torch_version=torch.__version__,
                parity_max_abs_diff=diffs,
            ),
        ),
    )
    write_manifest(manifest, out / "model.json")
    return manifest
