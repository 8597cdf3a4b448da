"""Train the small DETR on the synthetic digits detection set (:mod:`models.detection_data`).

Recipe: the ``digits-small`` config of :mod:`models.detr` (pre-norm, six 3x3 convolutions down
to an 8x8 map of the 128x128 letterboxed input, d = 128, 3 + 3 layers, 25 queries). As DETR
starts from an ImageNet-pretrained backbone, the backbone is first pretrained for
``--pretrain-steps`` to classify single digits of the train pool (:func:`pretrain_backbone`).
Then DETR's Hungarian set loss with auxiliary decoding losses, AdamW lr 3e-4 for the
transformer, the heads and the backbone alike, weight decay 1e-4, batch 32, gradients clipped
at 0.1 (DETR's ``clip_max_norm``), 200 linear warm-up steps, then a constant rate dropped 10x
at ``--lr-drop`` (DETR drops once, late). DETR trains its ImageNet backbone at a tenth of the
rate (``--lr-backbone 3e-5``, ``--keep-backbone-lr``); this small backbone, pretrained only
briefly, needs the full rate for the boxes to tighten, and a schedule this long on this many
canvases to reach AP 0.80 (the runs compared: README, Detection, and ``docs/detr-digits-recipes``).
Val AP (COCOeval) is measured every ``--eval-every`` steps, test AP once at the end. The
defaults, 60,000 train canvases (``--train-images``), 9,500 steps, the drop at 7,000:

    python -m models.train_detr --out runs/detr-digits

writes ``checkpoint.pt`` (the weights and everything export needs), ``last.pt`` (to
``--resume`` from), ``metrics.json`` and ``training_curves.png`` into ``--out``; the
generated splits are cached under ``--data`` (default ``data/detr-digits``; the 60,000 train
canvases take about 0.5 GB there and 4 GB of memory as float32 inputs).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from models.box_ops import box_xyxy_to_cxcywh
from models.detection_data import DIGIT_CLASSES, SPLIT_SIZES, Canvas, load_split, to_coco
from models.detection_eval import coco_ap, detect_images
from models.detr import DETR, build, config_dict
from models.losses import build_criterion
from models.training import plot_curves, seed_everything, write_json

CONFIG = "digits-small"
LABELS = [*DIGIT_CLASSES, "no-object"]  # DETR's "no object" class last
# The preprocessing the model is trained with; export copies it into the manifest.
PREPROCESSING = {
    "color_mode": "L",
    "resize": "letterbox",
    "size": {"height": 128, "width": 128},
    "interpolation": "bilinear",
    "scale": 1 / 255,
    "mean": [0.0],
    "std": [1.0],
    "pad_value": 0,
    # light ink on a dark canvas: a transparent pixel is the dark background
    "background": (0, 0, 0),
}
TRAINING_DATA = (
    "synthetic digits detection (models/detection_data.py, seed 2020): scikit-learn digits at 12-32 px on "
    "64-128 px noisy canvases, 1-5 objects; {train} train / {val} val / {test} test canvases, "
    "test canvases drawn only from the 360 held-out digits"
)


def preprocessing_spec():
    """``PREPROCESSING`` as the manifest's :class:`service.manifest.Preprocessing`."""
    from service.manifest import Preprocessing

    return Preprocessing.model_validate(PREPROCESSING)


def to_inputs_and_targets(canvases: list[Canvas]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Canvases -> model inputs float32 (N, 1, 128, 128) and DETR targets, exactly as served.

    The inputs come from the server's own :class:`service.preprocess.Preprocessor`; each
    target's ``boxes`` are normalised (cx, cy, w, h) in the letterboxed input frame, the
    inverse of :meth:`~service.preprocess.Preprocessor.box_scale`, ``labels`` int64.
    """
    from PIL import Image

    from service.preprocess import Preprocessor

    preprocess = Preprocessor(preprocessing_spec())
    inputs, targets = [], []
    for canvas in canvases:
        image = Image.fromarray(canvas.image)  # uint8 (H, W): mode "L"
        inputs.append(torch.from_numpy(preprocess(image)))
        sx, sy = preprocess.box_scale(image.size, image.size)
        boxes = torch.from_numpy(canvas.boxes) / torch.tensor([sx, sy, sx, sy], dtype=torch.float32)
        targets.append({"labels": torch.from_numpy(canvas.labels), "boxes": box_xyxy_to_cxcywh(boxes)})
    return torch.stack(inputs), targets


def torch_runner(model: DETR):
    """``model`` as a :data:`models.detection_eval.RunFn` (eval mode, no gradients)."""

    @torch.no_grad()
    def run(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        model.eval()
        out = model(torch.from_numpy(batch))
        return out["pred_logits"].numpy(), out["pred_boxes"].numpy()

    return run


def evaluate(model: DETR, canvases: list[Canvas]) -> dict[str, float]:
    """COCO AP of ``model`` on ``canvases`` (every query kept, as COCO evaluation wants)."""
    detections = detect_images(torch_runner(model), [c.image for c in canvases], preprocessing_spec(), LABELS)
    return coco_ap(to_coco(canvases), detections)


def pretrain_backbone(
    backbone: torch.nn.Module, *, steps: int, batch_size: int = 64, lr: float = 1e-3, seed: int = 0, quiet: bool = False
) -> dict[str, float]:
    """Pretrain the backbone to classify single digits of the train pool, as DETR starts from a pretrained ResNet.

    A linear head on the globally averaged feature map, cross-entropy, AdamW with warm-up and
    cosine decay; crops from :func:`models.detection_data.digit_crops`, normalised as
    ``PREPROCESSING``. The head is thrown away; the backbone keeps its weights.

    Returns:
        ``pretrain_val_accuracy`` on 1,000 crops of the val pool and ``pretrain_seconds``.
    """
    from models.detection_data import digit_crops
    from models.training import warmup_cosine

    def normalise(crops: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(crops).float().unsqueeze(1) * PREPROCESSING["scale"]  # (B, 1, 64, 64)
        return (x - PREPROCESSING["mean"][0]) / PREPROCESSING["std"][0]

    started = time.perf_counter()
    head = torch.nn.Linear(backbone.num_channels, len(DIGIT_CLASSES))
    parameters = [*backbone.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps, min(100, steps // 10 + 1)))
    rng = np.random.default_rng((seed, 1))
    backbone.train()
    for _ in tqdm(range(steps), desc="backbone pretraining", disable=quiet, file=sys.stderr, mininterval=2.0):
        crops, labels = digit_crops("train", batch_size, rng)
        loss = torch.nn.functional.cross_entropy(
            head(backbone(normalise(crops)).mean((2, 3))), torch.from_numpy(labels)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    crops, labels = digit_crops("val", 1000, np.random.default_rng((seed, 2)))
    backbone.eval()
    with torch.no_grad():
        predicted = head(backbone(normalise(crops)).mean((2, 3))).argmax(1).numpy()
    return {
        "pretrain_val_accuracy": float(np.mean(predicted == labels)),
        "pretrain_seconds": time.perf_counter() - started,
    }


def learning_rate_factor(step: int, warmup_steps: int, lr_drop: int) -> float:
    """Linear warm-up to 1 over ``warmup_steps``, then 1, then 0.1 from ``lr_drop`` on."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return 0.1 if step >= lr_drop else 1.0


def train(
    out: Path,
    *,
    data: Path | None = Path("data/detr-digits"),
    steps: int = 9500,
    lr_drop: int = 7000,
    warmup_steps: int = 200,
    batch_size: int = 32,
    lr: float = 3e-4,
    lr_backbone: float = 3e-4,
    backbone_lr_drop: bool = True,
    pretrain_steps: int = 1000,
    weight_decay: float = 1e-4,
    clip_max_norm: float = 0.1,
    eval_every: int = 500,
    seed: int = 0,
    threads: int = 1,
    split_sizes: dict[str, int] | None = None,
    resume: Path | None = None,
    quiet: bool = False,
) -> dict[str, float]:
    """Train, evaluate on the test split, and write the checkpoint, metrics and curves.

    Args:
        out: output folder.
        data: where the generated splits are cached (None: generate in memory only).
        lr, lr_backbone: learning rates of the transformer and heads, and of the (pretrained)
            backbone (DETR: 1e-4 and 1e-5; here both 3e-4).
        backbone_lr_drop: drop the backbone's rate at ``lr_drop`` too (DETR's schedule; False keeps it).
        pretrain_steps: steps of :func:`pretrain_backbone` first (0: train from scratch).
        threads: torch CPU threads.
        split_sizes: canvases per split (default ``SPLIT_SIZES``; ``--train-images`` sets train's,
            tests make all smaller).
        resume: a ``last.pt`` to continue from (same recipe).

    Returns:
        The metrics written to ``metrics.json``.
    """
    torch.set_num_threads(threads)
    generator = seed_everything(seed)
    sizes = {**SPLIT_SIZES, **(split_sizes or {})}
    splits = {split: load_split(split, data, sizes[split]) for split in ("train", "val", "test")}
    x_train, y_train = to_inputs_and_targets(splits["train"])

    model = build(CONFIG)
    pretrained = {}
    if pretrain_steps and resume is None:
        pretrained = pretrain_backbone(model.backbone, steps=pretrain_steps, seed=seed, quiet=quiet)
        if not quiet:
            print(f"backbone pretrained: val accuracy {pretrained['pretrain_val_accuracy']:.4f}", file=sys.stderr)
    criterion = build_criterion(model.config.num_classes)
    backbone_ids = {id(p) for p in model.backbone.parameters()}
    groups = [
        {"params": [p for p in model.parameters() if id(p) not in backbone_ids], "lr": lr},
        {"params": list(model.backbone.parameters()), "lr": lr_backbone},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    backbone_drop = lr_drop if backbone_lr_drop else steps + 1  # never, within the run
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        [
            lambda s: learning_rate_factor(s, warmup_steps, lr_drop),
            lambda s: learning_rate_factor(s, warmup_steps, backbone_drop),
        ],
    )
    history: dict[str, list[tuple[float, float]]] = {
        "train loss": [],
        "val AP": [],
        "val AP50": [],
        "learning rate": [],
    }
    step, elapsed, cpu_elapsed = 0, 0.0, 0.0
    if resume is not None:
        state = torch.load(resume, map_location="cpu", weights_only=False)
        pretrained = state.get("pretrained", {})
        model.load_state_dict(state["state_dict"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["generator"])
        step, history, elapsed, cpu_elapsed = state["step"], state["history"], state["seconds"], state["cpu_seconds"]

    def save_last() -> None:
        torch.save(
            {
                "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "generator": generator.get_state(),
                "step": step,
                "history": history,
                "seconds": elapsed + time.perf_counter() - started,
                "cpu_seconds": cpu_elapsed + time.process_time() - cpu_started,
                "pretrained": pretrained,
            },
            out / "last.pt",
        )

    out.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    progress = tqdm(total=steps, initial=step, desc="detr-digits", disable=quiet, file=sys.stderr, mininterval=2.0)
    order = torch.randperm(len(x_train), generator=generator)
    cursor = 0
    while step < steps:
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(x_train), generator=generator), 0
        index = order[cursor : cursor + batch_size]
        cursor += batch_size
        model.train()
        losses = criterion(model(x_train[index]), [y_train[i] for i in index.tolist()])
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_max_norm)
        optimizer.step()
        history["learning rate"].append((step, schedule.get_last_lr()[0]))
        schedule.step()
        step += 1
        history["train loss"].append((step, losses["loss"].item()))
        progress.update(1)
        progress.set_postfix(loss=f"{losses['loss'].item():.3f}", refresh=False)
        if step % eval_every == 0 or step == steps:
            val = evaluate(model, splits["val"])
            history["val AP"].append((step, val["AP"]))
            history["val AP50"].append((step, val["AP50"]))
            progress.write(
                f"step {step}: val AP {val['AP']:.4f}, AP50 {val['AP50']:.4f}, load {os.getloadavg()[0]:.2f}"
            )
            save_last()
    progress.close()
    seconds = elapsed + time.perf_counter() - started
    cpu_seconds = cpu_elapsed + time.process_time() - cpu_started

    test = evaluate(model, splits["test"])
    val = evaluate(model, splits["val"])
    metrics = {
        **{f"test_{k}": v for k, v in test.items()},
        "val_AP": val["AP"],
        "val_AP50": val["AP50"],
        **{k: round(v, 4) for k, v in pretrained.items()},
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "torch_threads": threads,
        "steps": steps,
        "batch_size": batch_size,
        "train_images": len(splits["train"]),
        "test_images": len(splits["test"]),
        "test_objects": int(sum(len(c.labels) for c in splits["test"])),
        "seed": seed,
    }
    save_checkpoint(model, out / "checkpoint.pt", metrics, sizes)
    write_json(metrics, out / "metrics.json")
    plot_curves(
        history,
        out / "training_curves.png",
        f"DETR digits: test AP {metrics['test_AP']:.3f}, AP50 {metrics['test_AP50']:.3f} ({steps} steps)",
    )
    return metrics


def save_checkpoint(model: DETR, path: Path, metrics: dict[str, Any], sizes: dict[str, int]) -> None:
    """The checkpoint export reads: architecture, config, weights, labels, preprocessing, provenance."""
    torch.save(
        {
            "architecture": "detr",
            "dataset": "digits-detection",
            "config": config_dict(model.config),
            "state_dict": model.state_dict(),
            "labels": LABELS,
            "preprocessing": PREPROCESSING,
            "metrics": metrics,
            "split_sizes": sizes,
            "training_data": TRAINING_DATA.format(**{k: f"{v:,}" for k, v in sizes.items()}),
            "recipe": "python -m models.train_detr " + shlex.join(sys.argv[1:]),
            "torch_version": torch.__version__,
        },
        path,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/detr-digits"))
    parser.add_argument("--data", type=Path, default=Path("data/detr-digits"), help="cache of the generated splits")
    parser.add_argument("--steps", type=int, default=9500)
    parser.add_argument("--lr-drop", type=int, default=7000, help="step at which the learning rate drops 10x")
    parser.add_argument("--lr", type=float, default=3e-4, help="transformer and heads (AdamW)")
    parser.add_argument("--lr-backbone", type=float, default=3e-4, help="the pretrained backbone")
    parser.add_argument("--keep-backbone-lr", action="store_true", help="drop only the transformer's rate")
    parser.add_argument("--pretrain-steps", type=int, default=1000, help="backbone pretraining steps (0: none)")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--train-images", type=int, default=SPLIT_SIZES["train"], help="train canvases (generated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--resume", type=Path, default=None, help="a last.pt to continue from")
    args = parser.parse_args(argv)
    metrics = train(
        args.out,
        data=args.data,
        steps=args.steps,
        lr_drop=args.lr_drop,
        lr=args.lr,
        lr_backbone=args.lr_backbone,
        backbone_lr_drop=not args.keep_backbone_lr,
        pretrain_steps=args.pretrain_steps,
        eval_every=args.eval_every,
        seed=args.seed,
        threads=args.threads,
        split_sizes={"train": args.train_images},
        resume=args.resume,
    )
    print(
        f"test AP {metrics['test_AP']:.4f}, AP50 {metrics['test_AP50']:.4f} "
        f"({metrics['train_seconds']} s, {metrics['train_cpu_seconds']} CPU s); wrote {args.out}"
    )


if __name__ == "__main__":
    main()
