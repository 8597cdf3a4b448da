"""Average the weights of CIFAR-10 runs of one model: stochastic weight averaging (SWA).

    python -m models.average_checkpoints runs/deit-cifar10/checkpoint.pt \
        runs/deit-cifar10-ft/checkpoint.pt --out runs/deit-cifar10-swa

SWA (Izmailov et al., "Averaging Weights Leads to Wider Optima and Better Generalization",
UAI 2018, Sec. 3.2) averages the weights that a cyclical learning-rate schedule reaches at the
ends of its cycles, and then recomputes the BatchNorm statistics with one pass over the
training data, because the running statistics of the averaged network are not the average of
the running statistics (Sec. 3.2, "Batch normalization"). Here the cycles are a run of
``models.train_cifar`` and its warm restarts (``--init``): each ends at the floor of its cosine
schedule. Every float parameter and buffer is the uniform mean of the checkpoints'; the
BatchNorm layers (the ViT's conv stem, the CNN) are then reset and re-estimated
(``torch.optim.swa_utils.update_bn``, a cumulative mean) on the training split, normalised as the
server does and augmented as the runs were trained (``models.train_cifar``'s random crop and
flip, and random erasing at ``--erase``), as SWA's own code does with its training loader. The
augmentation matters: the layers after a BatchNorm were trained on its statistics of augmented
batches, and statistics of the clean images (the first version of this command) cost a DeiT
checkpoint 0.4 points of test accuracy on their own (0.8441 → 0.8400; with crop, flip and
erasing at 0.25, as it was trained: 0.8442), which is why the averages in docs/models.md made
before 2026-12-06 came out under their runs.

Writes into ``--out`` a ``checkpoint.pt`` in ``models.train_cifar``'s format (for
``python -m export checkpoint``) and ``metrics.json``: the test accuracy of the average and of
each checkpoint (measured here, PyTorch, float32), the training time summed over the runs,
and the epochs summed (each warm restart counts its own).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.augment import random_crop_flip, random_erase
from models.cifar import load_cifar10_splits
from models.train_cifar import build_model, evaluate, normalise, to_device_tensor
from models.training import write_json

log = logging.getLogger(__name__)

# what a CIFAR-10 checkpoint of models.train_cifar must share with the others to be averaged
_SHARED = ("architecture", "dataset", "config", "labels", "preprocessing")


def load_checkpoints(paths: list[Path]) -> list[dict[str, Any]]:
    """The checkpoints at ``paths``, checked to be runs of one model.

    Raises:
        ValueError: fewer than two paths; a checkpoint not of ``models.train_cifar``; or two that
            differ in architecture, dataset, config, labels or preprocessing (its mean and std).
    """
    if len(paths) < 2:
        raise ValueError("averaging needs at least two checkpoints")
    checkpoints = [torch.load(path, map_location="cpu", weights_only=False) for path in paths]
    for path, checkpoint in zip(paths, checkpoints, strict=True):
        if checkpoint.get("dataset") != "cifar10" or "state_dict" not in checkpoint:
            raise ValueError(f"{path} is not a CIFAR-10 checkpoint of models.train_cifar")
        for key in _SHARED:
            if checkpoint.get(key) != checkpoints[0].get(key):
                raise ValueError(f"{path} differs from {paths[0]} in {key}: not runs of one model")
    return checkpoints


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The uniform mean of float tensors (in float64, cast back); integer buffers from the first.

    Integer buffers are BatchNorm's ``num_batches_tracked``; BatchNorm's statistics are
    re-estimated afterwards (:func:`update_batchnorm`).
    """
    averaged: dict[str, torch.Tensor] = {}
    for name, first in state_dicts[0].items():
        if first.is_floating_point():
            mean = torch.stack([sd[name].double() for sd in state_dicts]).mean(dim=0)
            averaged[name] = mean.to(first.dtype)
        else:
            averaged[name] = first.clone()
    return averaged


def augmented_batches(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    batch_size: int,
    *,
    erase: float,
    generator: torch.Generator,
) -> Iterator[torch.Tensor]:
    """Batches of ``images`` augmented as ``models.train_cifar`` trains, for BatchNorm statistics.

    Each batch, in order, is normalised, randomly cropped (4-pixel reflect padding) and flipped,
    and, if ``erase`` > 0, randomly erased with probability ``erase`` per image; the draws come
    from ``generator`` in that order, batch after batch, as each batch is made. Lazy: one float
    batch in memory at a time (wrap it in ``list`` to iterate more than once).

    Args:
        images: uint8 (N, C, H, W), pixel values 0-255.
        mean: float32 (1, C, 1, 1), subtracted per channel from pixel / 255 (the preprocessing's).
        std: float32 (1, C, 1, 1), what that is then divided by, per channel (the preprocessing's).
        batch_size: images per batch (the last batch may be smaller).
        erase: random-erasing probability per image (0: no erasing, and no draws for it).
        generator: CPU generator for every random draw.

    Yields:
        float32 (B, C, H, W), normalised, B = ``batch_size`` (fewer in the last batch).
    """
    for start in range(0, len(images), batch_size):
        batch = random_crop_flip(normalise(images[start : start + batch_size], mean, std), generator)
        yield random_erase(batch, generator, prob=erase) if erase > 0 else batch


@torch.no_grad()
def update_batchnorm(
    model: nn.Module,
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    batch_size: int = 500,
    *,
    erase: float = 0.0,
    seed: int = 0,
) -> int:
    """Re-estimate every BatchNorm's running mean and variance on uint8 (N, C, H, W) ``images``.

    Each batch is normalised, randomly cropped (4-pixel reflect padding) and flipped, and randomly
    erased with probability ``erase``, as ``models.train_cifar`` trains (:func:`augmented_batches`;
    ``seed`` draws them).

    Returns:
        The number of BatchNorm layers updated (0: nothing to do, the model is left as it was).
    """
    generator = torch.Generator().manual_seed(seed)
    # lazy: one float batch in memory at a time, not the whole split (~600 MB)
    batches = augmented_batches(images, mean, std, batch_size, erase=erase, generator=generator)
    layers = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if layers:
        torch.optim.swa_utils.update_bn(batches, model)
    model.eval()
    return layers


def average(
    paths: list[Path],
    out: Path,
    *,
    erase: float = 0.0,
    data: Path | None = None,
    limit_per_class: int | None = None,
) -> dict[str, Any]:
    """Average the checkpoints at ``paths``, re-estimate BatchNorm, evaluate, write ``out``.

    ``erase`` is the runs' random-erasing probability (``--erase`` of ``models.train_cifar``),
    used again while BatchNorm is re-estimated (:func:`update_batchnorm`).

    Returns:
        The metrics written to ``out/metrics.json``.

    Raises:
        ValueError: as :func:`load_checkpoints`.
    """
    started = time.perf_counter()
    checkpoints = load_checkpoints(paths)
    first = checkpoints[0]
    train_split, test_split = load_cifar10_splits(data, limit_per_class)
    mean = torch.tensor(first["preprocessing"]["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(first["preprocessing"]["std"]).view(1, 3, 1, 1)
    x_train = to_device_tensor(train_split.images, torch.device("cpu"))
    x_test = to_device_tensor(test_split.images, torch.device("cpu"))
    y_test = torch.from_numpy(test_split.labels)

    model, config = build_model(first["architecture"])
    if config != first["config"]:
        raise ValueError(f"{paths[0]}'s config is not models.train_cifar's for {first['architecture']}")
    accuracies = []
    for checkpoint in checkpoints:
        model.load_state_dict(checkpoint["state_dict"])
        accuracies.append(evaluate(model, x_test, y_test, mean, std)[1])
    model.load_state_dict(average_state_dicts([c["state_dict"] for c in checkpoints]))
    batchnorm_layers = update_batchnorm(model, x_train, mean, std, erase=erase)
    test_loss, test_accuracy = evaluate(model, x_test, y_test, mean, std)
    log.info("averaged %d checkpoints (test accuracy %s): %.4f", len(paths), accuracies, test_accuracy)

    runs = [c["metrics"] for c in checkpoints]
    metrics: dict[str, Any] = {
        "test_accuracy": test_accuracy,
        "test_loss": round(test_loss, 4),
        "averaged_from": [str(p) for p in paths],
        "averaged_test_accuracies": accuracies,
        "batchnorm_layers_reestimated": batchnorm_layers,
        "batchnorm_augmentation": {"crop_padding": 4, "flip": True, "erase": erase},
        "epochs": sum(int(m["epochs"]) for m in runs),
        "train_seconds": round(sum(float(m["train_seconds"]) for m in runs), 1),
        "wall_seconds": round(sum(float(m["wall_seconds"]) for m in runs) + time.perf_counter() - started, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": runs[-1].get("device", "cpu"),
        "torch_version": torch.__version__,
        "train_images": len(x_train),
        "test_images": len(x_test),
    }
    recipe = shlex.join(
        ["python", "-m", "models.average_checkpoints", *map(str, paths), "--out", str(out), "--erase", str(erase)]
    )
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            **{key: first[key] for key in _SHARED},
            "state_dict": model.state_dict(),
            "metrics": metrics,
            "training_data": first["training_data"],
            "recipe": "; then ".join([*(c["recipe"] for c in checkpoints), recipe]),
            "torch_version": torch.__version__,
        },
        out / "checkpoint.pt",
    )
    write_json(metrics, out / "metrics.json")
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+", help="checkpoint.pt files of models.train_cifar")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--erase", type=float, default=0.0, help="the runs' --erase, for BatchNorm's statistics")
    parser.add_argument("--data", type=Path, default=None, help="cifar10-jpeg.zip (default: ../shared/data/)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(average(args.checkpoints, args.out, erase=args.erase, data=args.data))


if __name__ == "__main__":
    main()
