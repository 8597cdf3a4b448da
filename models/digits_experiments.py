"""The reference experiments on the digits ViT, reproduced: what position embeddings and data buy.

    python -m models.digits_experiments --out docs/digits-experiments

Four trainings with the digits recipe (``models.train_digits``: AdamW lr 3e-3, 690 steps,
batch 64), each at every seed given (default: 8, the reference's seed, then 0 to 3), on one
CPU thread (these models are too small to gain from more; ~4 minutes for all 20 runs):

1. ``vit``: the reference ViT (learned position embeddings), all 1,437 training images;
2. ``vit-no-pos``: the same without position embeddings (reference: 0.725);
3. ``vit-150`` and ``cnn-150``: the ViT and a CNN of about the same size
   (``models.cnn.CONFIGS["digits"]``) trained on the first 150 training images only
   (reference: ViT 0.781, CNN 0.928).

Then the patch-shuffle test on the first two: every test image has its 16 patches (2x2
pixels each) permuted at random and is classified again. Without position embeddings the
class token cannot tell the order of its inputs (self-attention is permutation-equivariant;
Dosovitskiy et al. 2021, Appendix D.4), so no prediction may change; with them most do
(reference: 304 of 360).

Writes ``results.json``, ``results.md`` (the table in docs/models.md), and ``<run>/seed-<n>/metrics.json``
under ``--out``, with ``training_curves.png`` beside it for the first seed.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.datasets import load_digits_splits
from models.train_digits import to_tensor, train
from models.vit import ViT, ViTConfig

log = logging.getLogger(__name__)

PATCH = 2
REFERENCE = {
    "vit": "0.975 (seed 8)",
    "vit-no-pos": "0.725",
    "vit-150": "0.781",
    "cnn-150": "0.928",
    "shuffle-vit": "304 of 360 change",
    "shuffle-vit-no-pos": "none change",
}
RUNS: dict[str, dict[str, Any]] = {
    "vit": {"architecture": "vit"},
    "vit-no-pos": {"architecture": "vit", "position_embedding": False},
    "vit-150": {"architecture": "vit", "train_size": 150},
    "cnn-150": {"architecture": "cnn", "train_size": 150},
}


def shuffle_patches(images: np.ndarray, patch: int, rng: np.random.Generator) -> np.ndarray:
    """Permute the non-overlapping ``patch`` x ``patch`` patches of each image, independently per image.

    Args:
        images: (N, H, W) with H and W divisible by ``patch``.
        patch: side of a patch in pixels.
        rng: the source of the permutations.

    Returns:
        (N, H, W), same dtype: patch k (row-major) of output image n is patch ``perm_n[k]`` of
        input image n, ``perm_n`` a random permutation drawn for that image.
    """
    N, H, W = images.shape
    rows, cols = H // patch, W // patch
    patches = images.reshape(N, rows, patch, cols, patch).transpose(0, 1, 3, 2, 4).reshape(N, rows * cols, patch, patch)
    order = np.stack([rng.permutation(rows * cols) for _ in range(N)])  # (N, rows * cols)
    shuffled = np.take_along_axis(patches, order[:, :, None, None], axis=1)
    return shuffled.reshape(N, rows, cols, patch, patch).transpose(0, 1, 3, 2, 4).reshape(N, H, W)


@torch.no_grad()
def predict(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
    """Top-1 class ids, int64 (N,), of ``model`` on uint8 digits (N, 8, 8)."""
    model.eval()
    return model(to_tensor(images)).argmax(dim=1).numpy()


def shuffle_test(checkpoint: Path, images: np.ndarray, labels: np.ndarray, seed: int) -> dict[str, float]:
    """Classify the test images, then their patch-shuffled versions; count the changed predictions."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = ViT(ViTConfig(**state["config"]))
    model.load_state_dict(state["state_dict"])
    before = predict(model, images)
    after = predict(model, shuffle_patches(images, PATCH, np.random.default_rng(seed)))
    return {
        "changed": int(np.sum(before != after)),
        "images": len(images),
        "accuracy": float(np.mean(before == labels)),
        "accuracy_shuffled": float(np.mean(after == labels)),
    }


def run(out: Path, seeds: list[int]) -> dict[str, Any]:
    """Train every run at every seed, shuffle-test the full-data ViTs, write the results."""
    test = load_digits_splits()[1]
    results: dict[str, Any] = {"seeds": seeds, "runs": {}, "shuffle": {}}
    for name, options in RUNS.items():
        per_seed = {}
        for seed in seeds:
            run_dir = out / name / f"seed-{seed}"
            metrics = train(run_dir, seed=seed, quiet=True, **options)
            if seed != seeds[0]:
                (run_dir / "training_curves.png").unlink()  # one seed's curves are enough to look at
            per_seed[seed] = metrics["test_accuracy"]
            log.info("%s seed %d: test accuracy %.4f", name, seed, metrics["test_accuracy"])
            if name in ("vit", "vit-no-pos"):
                shuffled = shuffle_test(run_dir / "checkpoint.pt", test.images, test.labels, seed)
                results["shuffle"].setdefault(name, {})[seed] = shuffled
                log.info("%s seed %d: %d of %d predictions change", name, seed, shuffled["changed"], len(test.images))
            (run_dir / "checkpoint.pt").unlink()  # the curves and metrics stay; the weights are not needed
        accuracies = list(per_seed.values())
        results["runs"][name] = {
            "options": options,
            "test_accuracy": per_seed,
            "mean": float(np.mean(accuracies)),
            "std": float(np.std(accuracies)),
        }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(table(results) + "\n")
    return results


def table(results: dict) -> str:
    """The results as a Markdown table: the first seed, the mean over all seeds, the reference's figures."""
    seeds = results["seeds"]
    several = len(seeds) > 1
    heads = [f"seed {seeds[0]}"] + ([f"{len(seeds)} seeds ({', '.join(map(str, seeds))})"] if several else [])
    lines = [
        f"| experiment | {' | '.join(heads)} | reference |",
        "| --- | " + "--- | " * len(heads) + "--- |",
    ]
    labels = {
        "vit": "ViT, position embeddings, 1,437 training images: test accuracy",
        "vit-no-pos": "ViT without position embeddings: test accuracy",
        "vit-150": "ViT trained on 150 images: test accuracy",
        "cnn-150": "CNN (24k parameters) trained on 150 images: test accuracy",
    }
    for name, label in labels.items():
        run = results["runs"][name]
        values = [f"{_by_seed(run['test_accuracy'], seeds[0]):.3f}"]
        if several:
            values.append(f"{run['mean']:.3f} ± {run['std']:.3f}")
        lines.append(f"| {label} | {' | '.join(values)} | {REFERENCE[name]} |")
    for name, label in (("vit-no-pos", "without"), ("vit", "with")):
        per_seed = results["shuffle"][name]
        images = _by_seed(per_seed, seeds[0])["images"]
        values = [f"{_by_seed(per_seed, seeds[0])['changed']} of {images}"]
        if several:
            values.append(" / ".join(str(_by_seed(per_seed, s)["changed"]) for s in seeds) + f" of {images}")
        lines.append(
            f"| patches of every test image shuffled, ViT {label} position embeddings: "
            f"predictions that change | {' | '.join(values)} | {REFERENCE['shuffle-' + name]} |"
        )
    return "\n".join(lines)


def _by_seed(values: dict[Any, Any], seed: int) -> Any:
    """``values[seed]``, whether the keys are ints (in memory) or strings (read back from JSON)."""
    return values[seed] if seed in values else values[str(seed)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/digits-experiments"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[8, 0, 1, 2, 3])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    results = run(args.out, args.seeds)
    print(table(results))


if __name__ == "__main__":
    main()
