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
canvases to reach AP 0.80 (the runs compared: docs/models.md, Detection, and ``docs/detr-digits-recipes``).
Val AP (COCOeval) is measured every ``--eval-every`` steps, test AP once at the end. The
defaults, 60,000 train canvases (``--train-images``), 9,500 steps, the drop at 7,000:

    python -m models.train_detr --out runs/detr-digits

writes ``checkpoint.pt`` (the weights and everything export needs), ``last.pt`` (to
``--resume`` from), ``metrics.json`` and ``training_curves.png`` into ``--out``; the
generated splits are cached under ``--data`` (default ``data/detr-digits``; the 60,000 train
canvases take about 0.5 GB there and 4 GB of memory as float32 inputs).

Recipe levers (issue 21; defaults keep the recipe above), each registered in one place:
``--class-loss focal`` (``models.losses.CLASSIFICATIONS``: Deformable DETR's sigmoid focal
loss and cost, no "no object" class; the checkpoint's ``postprocess`` becomes ``"sigmoid"``),
``--groups K`` (Group DETR: K query groups matched one-to-one each, only group 0 kept in the
checkpoint), ``--set FIELD=VALUE`` (any ``models.detr.DETRConfig`` field, e.g.
``num_queries=100``, ``num_decoder_layers=6``, or ``dn_groups=5`` for DN-DETR's denoising
queries), ``--inputs bucket|padded``
(``models.detr_inputs.INPUT_FORMATS``: canvases at their own size with a pixel mask instead of
letterboxed, issue 18). ``--sitting-steps N`` stops after N steps of this call, with ``last.pt``
written, to ``--resume`` in a later sitting. Every evaluation reports, beside AP, what users see
at threshold 0.5 (``models.detection_eval.set_quality``): the share of canvases holding a
duplicate pair, precision and recall; they go into ``metrics.json`` and the curves.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from models.backbone import ConvBackbone, ResNet50
from models.detection_data import DIGIT_CLASSES, SPLIT_SIZES, Canvas, load_split, to_coco
from models.detection_eval import coco_ap, set_quality
from models.detr import DETR, build, config_dict, for_inference
from models.detr_inputs import INPUT_FORMATS, PREPROCESSING, InputFormat, MaskedRunFn, epoch_batches
from models.losses import CLASSIFICATIONS, build_criterion
from models.training import machine, plot_curves, seed_everything, write_json

if TYPE_CHECKING:
    from service.imaging.spec import Preprocessing

CONFIG = "digits-small"
LABELS = [*DIGIT_CLASSES, "no-object"]  # DETR's "no object" class last
SIGMOID_LABELS = list(DIGIT_CLASSES)  # a sigmoid class head has no "no object" output
# PREPROCESSING (models.detr_inputs): the letterbox the model is trained with; export copies it.
QUALITY = ("duplicate_canvas_fraction", "precision", "recall")  # set_quality's, at threshold 0.5
TRAINING_DATA = (
    "synthetic digits detection (models/detection_data.py, seed 2020): scikit-learn digits at 12-32 px on "
    "64-128 px noisy canvases, 1-5 objects; {train} train / {val} val / {test} test canvases, "
    "test canvases drawn only from the 360 held-out digits"
)


def preprocessing_spec() -> Preprocessing:
    """``PREPROCESSING`` as the manifest's :class:`service.imaging.spec.Preprocessing`."""
    from service.imaging.spec import Preprocessing

    return Preprocessing.model_validate(PREPROCESSING)


def to_inputs_and_targets(canvases: list[Canvas]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Canvases -> model inputs float32 (N, 1, 128, 128) and DETR targets, exactly as served.

    The letterbox format of :mod:`models.detr_inputs`: the server's own
    :class:`service.imaging.preprocess.Preprocessor`; each target's ``boxes`` are normalised
    (cx, cy, w, h) in the letterboxed input frame, the inverse of
    :meth:`~service.imaging.preprocess.Preprocessor.box_scale`, ``labels`` int64.
    """
    prepared = INPUT_FORMATS["letterbox"].prepare(canvases)
    return prepared.images, prepared.targets


def torch_runner(model: DETR) -> MaskedRunFn:
    """``model`` as a :data:`models.detr_inputs.MaskedRunFn` (eval mode, no gradients)."""

    device = next(model.parameters()).device

    @torch.no_grad()
    def run(batch: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        model.eval()
        out = model(torch.from_numpy(batch).to(device), None if mask is None else torch.from_numpy(mask).to(device))
        return out["pred_logits"].cpu().numpy(), out["pred_boxes"].cpu().numpy()

    return run


def evaluate(
    model: DETR, canvases: list[Canvas], inputs: InputFormat | None = None, postprocess: str = "softmax"
) -> dict[str, float]:
    """COCO AP of ``model`` on ``canvases`` (every query kept, as COCO evaluation wants), and
    :func:`~models.detection_eval.set_quality` at the detect route's default threshold 0.5.

    Args:
        inputs: the input format (default letterbox, as served today).
        postprocess: ``"softmax"`` or ``"sigmoid"``, the checkpoint's ``postprocess``.
    """
    inputs = inputs or INPUT_FORMATS["letterbox"]
    labels = SIGMOID_LABELS if postprocess == "sigmoid" else LABELS
    detections = inputs.detections(torch_runner(model), canvases, labels, postprocess)
    truth = to_coco(canvases)
    quality = set_quality(truth, detections, threshold=0.5)
    return {**coco_ap(truth, detections), **{k: quality[k] for k in QUALITY}}


def pretrain_backbone(
    backbone: ResNet50 | ConvBackbone,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    quiet: bool = False,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Pretrain the backbone to classify single digits of the train pool, as DETR starts from a pretrained ResNet.

    A linear head on the globally averaged feature map, cross-entropy, AdamW with warm-up and
    cosine decay; crops from :func:`models.detection_data.digit_crops`, normalised as
    ``PREPROCESSING``. The head is thrown away; the backbone keeps its weights. ``device``: where the backbone is (the
    crops are drawn on the CPU and moved there; default the CPU).

    Returns:
        ``pretrain_val_accuracy`` on 1,000 crops of the val pool and ``pretrain_seconds``.
    """
    from models.detection_data import digit_crops
    from models.training import warmup_cosine

    device = device or torch.device("cpu")

    def normalise(crops: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(crops).to(device).float().unsqueeze(1) * PREPROCESSING["scale"]  # (B, 1, 64, 64)
        return (x - PREPROCESSING["mean"][0]) / PREPROCESSING["std"][0]

    started = time.perf_counter()
    head = torch.nn.Linear(backbone.num_channels, len(DIGIT_CLASSES)).to(device)
    parameters = [*backbone.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(steps, min(100, steps // 10 + 1)))
    rng = np.random.default_rng((seed, 1))
    backbone.train()
    for _ in tqdm(range(steps), desc="backbone pretraining", disable=quiet, file=sys.stderr, mininterval=2.0):
        crops, labels = digit_crops("train", batch_size, rng)
        loss = torch.nn.functional.cross_entropy(
            head(backbone(normalise(crops)).mean((2, 3))), torch.from_numpy(labels).to(device)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    crops, labels = digit_crops("val", 1000, np.random.default_rng((seed, 2)))
    backbone.eval()
    with torch.no_grad():
        predicted = head(backbone(normalise(crops)).mean((2, 3))).argmax(1).cpu().numpy()
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
    class_loss: str = "softmax",
    groups: int = 1,
    overrides: dict[str, Any] | None = None,
    inputs: str = "letterbox",
    sitting_steps: int | None = None,
    recipe: str | None = None,
    init: Path | None = None,
    augment_digits: bool = False,
    device: str | None = None,
) -> dict[str, Any]:
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
        class_loss: a key of :data:`models.losses.CLASSIFICATIONS` ("softmax": DETR's; "focal").
        groups: Group DETR's query groups in training (1: none).
        overrides: :class:`models.detr.DETRConfig` fields to change (e.g. ``num_queries``).
        inputs: a key of :data:`models.detr_inputs.INPUT_FORMATS`.
        sitting_steps: stop after this many steps of this call (``last.pt`` written; resume later).
        recipe: the command recorded as the checkpoint's recipe (default: this process's
            ``python -m models.train_detr`` arguments).
        init: a ``last.pt`` of this script (same recipe) whose weights this run starts from,
            with a fresh optimizer and schedule and no backbone pretraining: a fine-tune, e.g.
            at the dropped rate on other canvases. With ``resume`` too (the same flags in a
            later sitting) the resumed ``last.pt`` wins.
        augment_digits: distort the train canvases' digits (:func:`models.detection_data.distort`;
            cached apart from the plain ones under ``data``); val and test stay as they are.
        device: "cpu" or "cuda" (None: CUDA when ``torch.cuda.is_available()``, else the CPU). The
            model, its inputs and targets, and the losses live there; batches are made, the
            matching (scipy) runs and the data order and DN-DETR's noise are drawn on the CPU, so
            a run draws the same batches either way. Float32 on both (no autocast).

    Returns:
        The metrics written to ``metrics.json``; after a sitting that stopped before ``steps``,
        only ``{"step": ..., "steps": ...}`` (nothing but ``last.pt`` is written then).
    """
    torch.set_num_threads(threads)
    generator = seed_everything(seed)
    form, input_format = CLASSIFICATIONS[class_loss], INPUT_FORMATS[inputs]
    if {"class_head", "num_groups"} & set(overrides or {}):
        raise ValueError("set the class head and the query groups with --class-loss and --groups, not --set")
    sizes = {**SPLIT_SIZES, **(split_sizes or {})}
    splits = {
        split: load_split(split, data, sizes[split], augment=augment_digits and split == "train")
        for split in ("train", "val", "test")
    }
    train_set = input_format.prepare(splits["train"])

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build(CONFIG, **{**(overrides or {}), "class_head": form.head, "num_groups": groups}).to(dev)
    pretrained: dict[str, Any] = {}
    started_from: dict[str, Any] = {}
    if init is not None and resume is None:  # resumed, the run's own last.pt holds where it started
        earlier = torch.load(init, map_location="cpu", weights_only=False)
        model.load_state_dict(earlier["state_dict"])
        pretrained = earlier.get("pretrained", {})
        started_from = {"initialised_from": str(init), "initial_step": earlier["step"]}
    if pretrain_steps and resume is None and init is None:
        pretrained = pretrain_backbone(model.backbone, steps=pretrain_steps, seed=seed, quiet=quiet, device=dev)
        if not quiet:
            print(f"backbone pretrained: val accuracy {pretrained['pretrain_val_accuracy']:.4f}", file=sys.stderr)
    criterion = build_criterion(model.config.num_classes, class_loss=class_loss, num_groups=groups).to(dev)
    backbone_ids = {id(p) for p in model.backbone.parameters()}
    parameter_groups = [
        {"params": [p for p in model.parameters() if id(p) not in backbone_ids], "lr": lr},
        {"params": list(model.backbone.parameters()), "lr": lr_backbone},
    ]
    optimizer = torch.optim.AdamW(parameter_groups, lr=lr, weight_decay=weight_decay)
    backbone_drop = lr_drop if backbone_lr_drop else steps + 1  # never, within the run
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        [
            lambda s: learning_rate_factor(s, warmup_steps, lr_drop),
            lambda s: learning_rate_factor(s, warmup_steps, backbone_drop),
        ],
    )
    series = ["train loss", "val AP", "val AP50", *(f"val {k}" for k in QUALITY), "learning rate"]
    history: dict[str, list[tuple[float, float]]] = {name: [] for name in series}
    step, elapsed, cpu_elapsed = 0, 0.0, 0.0
    if resume is not None:
        state = torch.load(resume, map_location="cpu", weights_only=False)
        pretrained = state.get("pretrained", {})
        model.load_state_dict(state["state_dict"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["generator"])
        step, elapsed, cpu_elapsed = state["step"], state["seconds"], state["cpu_seconds"]
        history = {**{name: [] for name in series}, **state["history"]}  # a last.pt from before a series existed
        started_from = state.get("started_from", {})

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
                "started_from": started_from,
            },
            out / "last.pt",
        )

    def evaluate_val() -> dict[str, float]:
        val = evaluate(model, splits["val"], input_format, form.postprocess)
        history["val AP"].append((step, val["AP"]))
        history["val AP50"].append((step, val["AP50"]))
        for k in QUALITY:
            history[f"val {k}"].append((step, val[k]))
        return val

    out.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    stop = steps if sitting_steps is None else min(steps, step + sitting_steps)
    progress = tqdm(total=steps, initial=step, desc="detr-digits", disable=quiet, file=sys.stderr, mininterval=2.0)
    batches: list[torch.Tensor] = []
    while step < stop:
        if not batches:
            batches = epoch_batches(train_set.buckets, batch_size, generator)[::-1]  # popped from the end
        images, mask, targets = input_format.batch(train_set, batches.pop())
        images, mask = images.to(dev), None if mask is None else mask.to(dev)
        targets = [{k: v.to(dev) for k, v in target.items()} for target in targets]
        model.train()
        losses = criterion(model(images, mask, targets), targets)  # targets: DN-DETR's noised queries, if any
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_max_norm)
        optimizer.step()
        history["learning rate"].append((step, float(schedule.get_last_lr()[0])))
        schedule.step()
        step += 1
        history["train loss"].append((step, losses["loss"].item()))
        progress.update(1)
        progress.set_postfix(loss=f"{losses['loss'].item():.3f}", refresh=False)
        if step % eval_every == 0 or step == steps:
            val = evaluate_val()
            progress.write(
                f"step {step}: val AP {val['AP']:.4f}, AP50 {val['AP50']:.4f}, duplicates on "
                f"{val['duplicate_canvas_fraction']:.1%} of canvases, precision {val['precision']:.4f}, "
                f"recall {val['recall']:.4f}, load {os.getloadavg()[0]:.2f}"
            )
            save_last()
        elif step == stop:
            save_last()
    progress.close()
    if step < steps:  # this sitting ends here; --resume out/last.pt continues
        return {"step": step, "steps": steps}
    seconds = elapsed + time.perf_counter() - started
    cpu_seconds = cpu_elapsed + time.process_time() - cpu_started

    test = evaluate(model, splits["test"], input_format, form.postprocess)
    val = evaluate(model, splits["val"], input_format, form.postprocess)
    metrics = {
        **{f"test_{k}": v for k, v in test.items()},
        "val_AP": val["AP"],
        "val_AP50": val["AP50"],
        **{f"val_{k}": val[k] for k in QUALITY},
        **{k: round(v, 4) for k, v in pretrained.items()},
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "torch_threads": threads,
        "device": machine() + (f"; {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else ""),
        "steps": steps,
        "batch_size": batch_size,
        "train_images": len(splits["train"]),
        "test_images": len(splits["test"]),
        "test_objects": int(sum(len(c.labels) for c in splits["test"])),
        "seed": seed,
        "class_loss": class_loss,
        "groups": groups,
        "inputs": inputs,
        "config_overrides": dict(overrides or {}),
        **({"augment_digits": True} if augment_digits else {}),
        **started_from,
    }
    save_checkpoint(for_inference(model), out / "checkpoint.pt", metrics, sizes, input_format, form.postprocess, recipe)
    write_json(metrics, out / "metrics.json")
    plot_curves(
        history,
        out / "training_curves.png",
        f"DETR digits: test AP {metrics['test_AP']:.3f}, AP50 {metrics['test_AP50']:.3f}, duplicates on "
        f"{metrics['test_duplicate_canvas_fraction']:.1%} of canvases ({steps} steps)",
    )
    return metrics


def save_checkpoint(
    model: DETR,
    path: Path,
    metrics: dict[str, Any],
    sizes: dict[str, int],
    inputs: InputFormat | None = None,
    postprocess: str = "softmax",
    recipe: str | None = None,
) -> None:
    """The checkpoint export reads: architecture, config, weights, labels, preprocessing, provenance.

    ``model`` is the inference model (:func:`models.detr.for_inference`: one query group).
    ``postprocess`` says how the served post-processing must read ``pred_logits``:
    ``"softmax"`` (over the classes and "no object", the last of ``labels``, which is dropped)
    or ``"sigmoid"`` (one sigmoid per class, no "no object" output nor label; Deformable DETR's
    top-k rule). ``pixel_mask`` says whether the graph takes one (then boxes are relative to the
    unpadded image: :mod:`models.detr_inputs`).
    """
    inputs = inputs or INPUT_FORMATS["letterbox"]
    torch.save(
        {
            "architecture": "detr",
            "dataset": "digits-detection",
            "config": config_dict(model.config),
            "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},  # loads where no GPU is
            "labels": SIGMOID_LABELS if postprocess == "sigmoid" else LABELS,
            "postprocess": postprocess,
            "pixel_mask": inputs.mask,
            "preprocessing": inputs.preprocessing(),
            "metrics": metrics,
            "split_sizes": sizes,
            "training_data": TRAINING_DATA.format(**{k: f"{v:,}" for k, v in sizes.items()}),
            "recipe": recipe or "python -m models.train_detr " + shlex.join(sys.argv[1:]),
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
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-images", type=int, default=SPLIT_SIZES["train"], help="train canvases (generated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--resume", type=Path, default=None, help="a last.pt to continue from")
    parser.add_argument("--class-loss", choices=sorted(CLASSIFICATIONS), default="softmax")
    parser.add_argument("--groups", type=int, default=1, help="Group DETR query groups in training")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="FIELD=VALUE", help="DETRConfig")
    parser.add_argument("--inputs", choices=sorted(INPUT_FORMATS), default="letterbox")
    parser.add_argument("--sitting-steps", type=int, default=None, help="stop after this many steps of this call")
    parser.add_argument("--init", type=Path, default=None, help="a last.pt whose weights to start from (fine-tune)")
    parser.add_argument("--augment-digits", action="store_true", help="distort the train canvases' digits")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: CUDA when available")
    args = parser.parse_args(argv)
    from models.detr import parse_overrides

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
        batch_size=args.batch_size,
        seed=args.seed,
        threads=args.threads,
        split_sizes={"train": args.train_images},
        resume=args.resume,
        class_loss=args.class_loss,
        groups=args.groups,
        overrides=parse_overrides(args.overrides),
        inputs=args.inputs,
        sitting_steps=args.sitting_steps,
        init=args.init,
        augment_digits=args.augment_digits,
        device=args.device,
    )
    if "test_AP" not in metrics:
        print(f"stopped at step {metrics['step']} of {metrics['steps']}; continue with --resume {args.out / 'last.pt'}")
        return
    print(
        f"test AP {metrics['test_AP']:.4f}, AP50 {metrics['test_AP50']:.4f}, duplicates on "
        f"{metrics['test_duplicate_canvas_fraction']:.1%} of canvases, precision {metrics['test_precision']:.4f}, "
        f"recall {metrics['test_recall']:.4f} ({metrics['train_seconds']} s, {metrics['train_cpu_seconds']} CPU s); "
        f"wrote {args.out}"
    )


if __name__ == "__main__":
    main()
