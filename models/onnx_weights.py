"""Recover a trainable checkpoint of the CIFAR-10 ViT from its served ONNX graph.

    python -m models.onnx_weights model_repository/vit-cifar10/2 --out runs/deit-cifar10-v2/checkpoint.pt

A served version's resumable training checkpoint is not always kept (``runs/`` is not
committed), but its graph is: ``torch.onnx.export`` keeps the parameters' names, stores each
``nn.Linear`` weight transposed for its MatMul (``val_*`` initializers, in the order of the
graph: qkv, proj, fc1, fc2 of each block) and folds each stem BatchNorm into the conv before it
(``patch_embed.K.weight`` scaled and a ``patch_embed.K.weight_bias`` added). This module undoes
both and writes a ``checkpoint.pt`` of ``models.train_cifar``, which ``--init`` starts from.

The folded BatchNorm y = W_f x + b_f is unfolded so that it is the same function in eval mode
and, on batches like the training data's, in training mode too: running mean m and variance
s^2 - eps are the per-channel statistics of W_f x over training images (augmented as the run
trained: crop, flip, random erasing), the scale is s and the shift m + b_f, so that
s (W_f x - m) / s + m + b_f = W_f x + b_f. The recovered model is checked against ONNX Runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn

from models import vit
from models.average_checkpoints import augmented_batches
from models.cifar import load_cifar10_splits
from models.train_cifar import TRAINING_DATA, normalise, to_device_tensor

LINEARS = ("attn.qkv", "attn.proj", "fc1", "fc2")


class RecoveryError(ValueError):
    """The graph is not one this module can map back onto ``models.vit.ViT``, or the recovered
    model's outputs differ from ONNX Runtime's by more than the tolerance."""


def graph_weights(path: Path, config: vit.ViTConfig) -> tuple[dict[str, np.ndarray], dict[int, tuple]]:
    """The ViT's parameters from the graph at ``path`` by name, float32, and each folded stem
    BatchNorm as ``{conv index: (folded weight, folded bias)}``.

    Raises:
        RecoveryError: a parameter is missing or has the wrong shape.
    """
    model = onnx.load(str(path))
    named = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    expected = vit.ViT(config).state_dict()
    weights: dict[str, np.ndarray] = {}
    transposed = [named[n] for n in named if n.startswith("val_") and named[n].ndim == 2]
    linears = [f"blocks.{b}.{layer}.weight" for b in range(config.depth) for layer in LINEARS]
    if len(transposed) != len(linears):
        raise RecoveryError(f"{len(transposed)} transposed matrices in the graph, expected {len(linears)}")
    for name, matrix in zip(linears, transposed, strict=True):
        weights[name] = matrix.T
    folded: dict[int, tuple] = {}
    for name, tensor in expected.items():
        if name in weights:
            continue
        if name in named:
            weights[name] = named[name]
        elif name.startswith("patch_embed.") and name.split(".")[1].isdigit():
            conv = int(name.split(".")[1]) - 1  # patch_embed.{K+1} is the BatchNorm after conv K
            if f"patch_embed.{conv}.weight_bias" not in named:
                raise RecoveryError(f"{name}: no folded conv patch_embed.{conv} in the graph")
            folded[conv] = (named[f"patch_embed.{conv}.weight"], named[f"patch_embed.{conv}.weight_bias"])
            continue
        else:
            raise RecoveryError(f"{name} is not in the graph")
        if tuple(weights[name].shape) != tuple(tensor.shape):
            raise RecoveryError(f"{name}: shape {weights[name].shape} in the graph, {tuple(tensor.shape)} expected")
    return weights, folded


@torch.no_grad()
def unfold_batchnorm(model: vit.ViT, folded: dict[int, tuple], batches: list[torch.Tensor]) -> None:
    """Set each stem conv K's weight to its folded one and BatchNorm K+1 to the affine map that
    reproduces the folded bias, with running statistics those of the conv's output over
    ``batches`` (float32 (B, 3, H, W), normalised), in order of depth (module docstring)."""
    stem = model.patch_embed
    assert isinstance(stem, nn.Sequential)
    for conv_index in sorted(folded):
        weight, bias = (torch.from_numpy(np.array(a)) for a in folded[conv_index])
        conv, norm = stem[conv_index], stem[conv_index + 1]
        assert isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)
        conv.weight.copy_(weight)
        total = torch.zeros(len(bias), dtype=torch.float64)
        square, count = torch.zeros_like(total), 0
        before = nn.Sequential(*list(stem)[: conv_index + 1])  # the layers before are already unfolded
        for batch in batches:
            x = before(batch)
            total += x.sum((0, 2, 3)).double()
            square += (x * x).sum((0, 2, 3)).double()
            count += x.shape[0] * x.shape[2] * x.shape[3]
        mean = (total / count).float()
        var = (square / count - (total / count) ** 2).float()
        assert norm.running_mean is not None and norm.running_var is not None
        norm.running_mean.copy_(mean)
        norm.running_var.copy_((var - norm.eps).clamp_min(1e-12))
        norm.weight.copy_(var.sqrt())
        norm.bias.copy_(mean + bias)


def recover(
    model_dir: Path,
    *,
    data: Path | None = None,
    limit_per_class: int | None = None,
    images: int = 5000,
    erase: float = 0.25,
    seed: int = 0,
) -> dict[str, Any]:
    """A ``models.train_cifar`` checkpoint (a dict for ``torch.save``) of the DeiT or ViT served
    from ``model_dir`` (``model.onnx`` and ``model.json``), its BatchNorm statistics measured on
    ``images`` training images, and the largest difference from ONNX Runtime on 64 test images
    (``data`` and ``limit_per_class`` as ``models.cifar.load_cifar10_splits``'; ``erase`` the
    random erasing the run trained with).

    Raises:
        RecoveryError: see the class; also a manifest that is not the CIFAR-10 ViT's.
    """
    manifest = json.loads((model_dir / "model.json").read_text())
    distillation = "distillation" in (manifest.get("attention") or {}).get("prefix_tokens", [])
    config = dataclasses.replace(vit.CONFIGS["cifar10"], distillation=distillation)
    if manifest["input"]["shape"][1:] != [config.in_channels, config.image_size, config.image_size]:
        raise RecoveryError(f"{model_dir}: input {manifest['input']['shape']} is not the CIFAR-10 ViT's")
    weights, folded = graph_weights(model_dir / "model.onnx", config)
    model = vit.ViT(config)
    state = model.state_dict()
    model.load_state_dict({**state, **{k: torch.from_numpy(np.array(v)) for k, v in weights.items()}})

    train_split, test_split = load_cifar10_splits(data, limit_per_class)
    generator = torch.Generator().manual_seed(seed)
    mean = torch.tensor(manifest["preprocessing"]["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(manifest["preprocessing"]["std"]).view(1, 3, 1, 1)
    pick = torch.randperm(len(train_split.images), generator=generator)[:images].numpy()
    x_train = to_device_tensor(train_split.images[pick], torch.device("cpu"))
    # a list: unfold_batchnorm passes over the batches once per stem conv
    batches = list(augmented_batches(x_train, mean, std, 250, erase=erase, generator=generator))
    unfold_batchnorm(model.eval(), folded, batches)

    x_test = normalise(to_device_tensor(test_split.images[:64], torch.device("cpu")), mean, std)
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run([manifest["roles"]["logits"]], {manifest["input"]["name"]: x_test.numpy()})[0]
    with torch.no_grad():
        got = model(x_test).numpy()
    difference = float(np.abs(got - expected).max())
    if difference > 1e-4:
        raise RecoveryError(f"the recovered model differs from ONNX Runtime by {difference:.2e} (> 1e-4)")
    metrics = manifest["provenance"]["metrics"]
    return {
        "architecture": "deit" if distillation else "vit",
        "dataset": "cifar10",
        "config": vit.config_dict(config),
        "state_dict": model.state_dict(),
        "labels": manifest["labels"],
        "preprocessing": manifest["preprocessing"],
        "metrics": {**metrics, "recovered_from": str(model_dir), "onnx_max_abs_diff": difference},
        "training_data": TRAINING_DATA,
        "recipe": manifest["provenance"]["recipe"],
        "torch_version": torch.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a version folder: model.onnx and model.json")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint.pt to write")
    parser.add_argument("--data", type=Path, default=None, help="cifar10-jpeg.zip (default: ../shared/data/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    checkpoint = recover(args.model_dir, data=args.data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, args.out)
    print(f"wrote {args.out}: ONNX Runtime agrees to {checkpoint['metrics']['onnx_max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
