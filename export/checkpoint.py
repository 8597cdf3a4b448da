"""Checkpoint (written by ``models/``) -> ``model.onnx`` + ``model.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from export import evaluate
from export.onnx_export import export_info, export_onnx, parity
from models.cnn import CNN, CNNConfig
from models.datasets import Split, load_digits_splits
from models.vit import ViT, ViTConfig
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing, Size
from service.runtime.manifest import (
    SCHEMA_VERSION,
    AttentionSpec,
    Manifest,
    Provenance,
    TensorSpec,
    write_manifest,
)
from service.tasks import classification


def _test_split(dataset: str) -> Split:
    if dataset == "digits":
        return load_digits_splits()[1]
    if dataset == "cifar10":
        from models.cifar import load_split

        return load_split("test")
    raise ValueError(f"no test split known for dataset {dataset!r}")


class ForServing(ViT):
    """A ViT whose graph outputs ``logits`` (B, num_classes), ``embedding`` (B, d) and, with
    ``attention``, ``attentions`` (B, depth, heads, T, T).

    ``embedding`` is the head's input: the class token after the final LayerNorm (the server's
    ``embed`` task L2-normalises it); for DeiT with a distillation token, the mean of the class
    and distillation tokens after it, and ``logits`` the mean of the two heads
    (:meth:`models.vit.ViT.pool`, :meth:`~models.vit.ViT.logits`). A ViT itself, holding
    ``vit``'s weights, so the graph's weights keep the checkpoint's names (``head.weight``, ...).
    """

    def __init__(self, vit: ViT, attention: bool) -> None:
        super().__init__(vit.config)
        self.load_state_dict(vit.state_dict())
        self.attention = attention

    # The graph's forward: images only (what torch.onnx traces), not ViT's training-time options.
    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        tokens, attentions = self.features(images, self.attention)
        logits, pooled = self.logits(tokens), self.pool(tokens)
        if self.attention:
            return logits, pooled, torch.stack(attentions, dim=1)
        return logits, pooled


def _model(checkpoint: dict[str, Any]) -> ViT | CNN:
    model: ViT | CNN
    if checkpoint["architecture"] in ("vit", "deit"):
        model = ViT(ViTConfig(**checkpoint["config"]))
    elif checkpoint["architecture"] == "cnn":
        model = CNN(CNNConfig(**checkpoint["config"]))
    else:
        raise ValueError(f"unknown architecture {checkpoint['architecture']!r}")
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval()


def _description(model: ViT | CNN, dataset: str) -> str:
    if isinstance(model, CNN):
        return f"CNN ({len(model.config.channels)} conv layers, {model.config.channels[-1]} wide) trained on {dataset}"
    c = model.config
    stem = ", conv stem" if c.stem == "conv" else ""
    patches = f"{c.patch_size}x{c.patch_size} patches{stem}"
    if c.upsample > 1:
        patches = f"{c.patch_size}x{c.patch_size} patches of the image enlarged {c.upsample}x{stem}"
    if c.distillation:
        return f"DeiT ({c.hidden_size} wide, {c.depth} blocks, {patches}, distillation token) trained on {dataset}"
    return f"ViT ({c.hidden_size} wide, {c.depth} blocks, {patches}) trained on {dataset}"


def export_checkpoint(checkpoint_path: Path, out: Path, *, opset: int, attention: bool = True) -> Manifest:
    """Export a classifier checkpoint and write its manifest.

    Parity is measured on real test images at batch sizes 1 and 7 (every output); the test
    accuracy is measured on the whole test split through ONNX Runtime with the server's
    preprocessing.

    Args:
        attention: for a ViT, add every block's attention weights as an output,
            ``attentions`` (B, depth, heads, T, T), recorded in the manifest's ``attention``
            (the server draws attention rollout from it).

    A ViT's graph also outputs ``embedding`` (B, d), the class token after the final
    LayerNorm, in the manifest's ``roles``: the model then serves ``embed`` beside
    ``classify``.

    Raises:
        ParityError: ONNX Runtime and PyTorch differ by more than 1e-4.
        ValueError: an architecture or dataset this exporter does not know.
    """
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if checkpoint["architecture"] == "detr":
        from export.detr import export_detr

        return export_detr(checkpoint, out, opset=opset)
    model = _model(checkpoint)
    vit = isinstance(model, ViT)
    attention = attention and vit
    graph = ForServing(model, attention).eval() if isinstance(model, ViT) else model
    outputs = ("logits", "embedding", "attentions")[: 1 + vit + attention]
    roles = {"logits": "logits", **({"embedding": "embedding"} if vit else {})}

    preprocessing = Preprocessing.model_validate(checkpoint["preprocessing"])
    test = _test_split(checkpoint["dataset"])
    preprocess = Preprocessor(preprocessing)
    inputs = torch.from_numpy(np.stack([preprocess(evaluate.pil_image(p)) for p in test.images[:7]]))  # (7, C, H, W)
    path = out / "model.onnx"
    export_onnx(graph, inputs[:2], path, output_names=outputs, opset=opset)
    diffs = parity(graph, path, [inputs[:1], inputs])
    onnx_accuracy = evaluate.accuracy(path, preprocessing, test)

    c, h, w = preprocess.output_shape
    attention_spec = None
    if attention and isinstance(model, ViT):  # attention is only ever asked of a ViT (above)
        attention_spec = AttentionSpec(
            output="attentions",
            grid=Size(height=model.config.grid, width=model.config.grid),
            prefix_tokens=["class", "distillation"] if model.config.distillation else ["class"],
        )
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        task=classification.TASK.name,
        description=_description(model, checkpoint["dataset"]),
        input=TensorSpec(name="pixel_values", dtype="float32", shape=["batch", c, h, w]),
        outputs=list(outputs),
        roles=roles,
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
                **{
                    key: float(checkpoint["metrics"][key])
                    for key in ("wall_seconds", "train_images_per_second", "parameters", "epochs")
                    if key in checkpoint["metrics"]
                },
            },
            export=export_info(opset, diffs),
            notes=f"trained on {checkpoint['metrics']['device']}" if "device" in checkpoint["metrics"] else "",
        ),
        attention=attention_spec,
    )
    write_manifest(manifest, out / "model.json")
    return manifest
