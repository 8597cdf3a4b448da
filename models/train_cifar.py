"""Train the CIFAR-10 photo ViT, or its CNN reference, with one DeiT-style recipe, on a CPU or a GPU.

    python -m models.train_cifar --arch vit --out runs/vit-cifar10     # the served model
    python -m models.train_cifar --arch cnn --out runs/cnn-cifar10     # the reference CNN
    python -m models.train_cifar --arch deit --teacher runs/cnn-cifar10/checkpoint.pt \
        --out runs/deit-cifar10                                          # DeiT, distilled from the CNN

The recipe (Touvron et al., "Training data-efficient image transformers", 2021, Table 9,
cut to a CPU budget): AdamW (lr 1e-3 at batch 128, weight decay 0.05, none on biases,
norms, class token and position embeddings), linear warm-up for 2 epochs then cosine
decay over 15 epochs, label smoothing 0.1, random crop (4-pixel reflect padding) and
horizontal flip; Mixup and CutMix are available (``--mixup``, ``--cutmix``) but off by
default: at a schedule this short the small models underfit, and mixing slows them further
(DeiT trains 300 epochs). Both architectures use the same command, recipe and epochs.

``--arch deit`` is the same ViT with DeiT's distillation token (``models.vit``), trained by
hard-label distillation (Touvron et al. 2021, Sec. 5.1, Eq. 3): the class head learns the true
label (label-smoothed, mixed like the image), the distillation head the teacher's argmax on
the same augmented image, each with weight 1/2. The teacher is a ``checkpoint.pt`` of this
script (``--teacher``; the CNN), frozen, in eval mode. ``--erase`` adds DeiT's random erasing.

The device is chosen automatically (CUDA when ``torch.cuda.is_available()``, with bf16
autocast; else the CPU, float32, all of its cores). ``torch.compile`` is used where it
works (``--no-compile`` turns it off). Each epoch ends with a resumable ``last.pt``;
``--resume`` picks a killed run up where it stopped, and ``--sitting-minutes M`` ends a sitting
cleanly (``last.pt`` written) before an epoch that would end past M minutes: a lent GPU machine's
time, or a shared machine's evening. ``last.pt`` records each sitting's epochs, device and time
(``sittings`` in ``metrics.json``), so a run trained partly on a CPU and partly on a GPU says so.
``--init`` starts from the weights of an earlier
run's ``checkpoint.pt`` (same architecture and config) with a fresh optimizer and schedule: a
second, shorter cosine cycle at a lower peak learning rate continues a run whose schedule has
ended (a warm restart, Loshchilov & Hutter, "SGDR", 2017).

Writes into ``--out``: ``checkpoint.pt`` (for ``python -m export checkpoint``),
``metrics.json`` (test accuracy, wall time, throughput, device), ``history.json`` and
``training_curves.png`` (loss and accuracy per epoch).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from models import cnn, vit
from models.augment import mix, random_crop_flip, random_erase, soft_cross_entropy, soft_targets
from models.cifar import CIFAR10_LABELS, load_cifar10_splits
from models.training import plot_curves, seed_everything, warmup_cosine, write_json

log = logging.getLogger(__name__)

# How the server turns any photo into the 32x32 input: scale so the shorter side is 32, crop
# the centre 32x32 (CIFAR's objects fill the frame), bicubic; mean and std are measured on the
# training split by ``train`` and filled in there.
PREPROCESSING: dict[str, Any] = {
    "color_mode": "RGB",
    "resize": "center_crop",
    "size": {"height": 32, "width": 32},
    "interpolation": "bicubic",
    "scale": 1 / 255,
}
TRAINING_DATA = "CIFAR-10 (Krizhevsky 2009) as 32x32 JPEGs: the 50,000 training images; test: the 10,000 test images"


ARCHITECTURES = ("vit", "deit", "cnn")


def build_model(arch: str, upsample: int = 1) -> tuple[nn.Module, dict[str, Any]]:
    """The model for ``arch`` ("vit", "deit" or "cnn") and its config as a plain dict;
    ``upsample`` is a ViT's (``models.vit.ViTConfig.upsample``)."""
    if arch in ("vit", "deit"):
        model = vit.build("cifar10", distillation=arch == "deit", upsample=upsample)
        return model, vit.config_dict(model.config)
    if upsample != 1:
        raise ValueError("--upsample is a ViT's")
    if arch == "cnn":
        cifar_cnn = cnn.build("cifar10")
        return cifar_cnn, cnn.config_dict(cifar_cnn.config)
    raise ValueError(f"unknown arch {arch!r}; one of {ARCHITECTURES}")


def load_teacher(path: Path, device: torch.device) -> nn.Module:
    """A frozen classifier from a ``checkpoint.pt`` this script wrote, in eval mode, on ``device``.

    Raises:
        ValueError: the checkpoint is not a CIFAR-10 classifier of this script.
    """
    checkpoint = torch.load(path, map_location=device, weights_only=False)
    if checkpoint.get("dataset") != "cifar10" or checkpoint.get("architecture") not in ARCHITECTURES:
        raise ValueError(f"{path} is not a CIFAR-10 checkpoint of models.train_cifar")
    if checkpoint["architecture"] == "cnn":
        teacher: nn.Module = cnn.CNN(cnn.CNNConfig(**checkpoint["config"]))
    else:
        teacher = vit.ViT(vit.ViTConfig(**checkpoint["config"]))
    teacher.load_state_dict(checkpoint["state_dict"])
    teacher.to(device).eval()
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    return teacher


def load_init(model: nn.Module, config: dict[str, Any], arch: str, path: Path) -> tuple[dict[str, Any], str | None]:
    """Load the weights of ``path`` (a ``checkpoint.pt`` of this script) into ``model``.

    A ViT's checkpoint may differ in ``upsample`` alone (a finer grid: DeiT's fine-tuning at a
    higher resolution, Touvron et al. 2021, Sec. 6); its patch position embeddings are then
    resampled to the new grid (:func:`models.vit.resample_position_embedding`).

    Returns:
        What the metrics record of the start (the checkpoint's path, its epochs and test
        accuracy), and the checkpoint's ``recipe`` (None if it records none), which this run's
        recipe continues.

    Raises:
        ValueError: the checkpoint is of another architecture or config.
    """
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    earlier_config = dict(checkpoint.get("config", {}))
    if "upsample" in config:
        earlier_config["upsample"] = config["upsample"]
    if checkpoint.get("architecture") != arch or earlier_config != config:
        raise ValueError(f"{path} is not a checkpoint of --arch {arch} with this config")
    state = dict(checkpoint["state_dict"])
    if isinstance(model, vit.ViT) and checkpoint["config"].get("upsample", 1) != config["upsample"]:
        state["pos_embed"] = vit.resample_position_embedding(
            state["pos_embed"], model.config.prefix_tokens, model.config.grid
        )
    model.load_state_dict(state)
    earlier = checkpoint.get("metrics", {})
    start = {
        "initialised_from": str(path),
        "initial_epochs": earlier.get("epochs"),
        "initial_test_accuracy": earlier.get("test_accuracy"),
    }
    return start, checkpoint.get("recipe") or None


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on weight matrices and conv kernels only (timm's practice)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    tokens = ("cls_token", "dist_token", "pos_embed")
    for name, parameter in model.named_parameters():
        (no_decay if parameter.ndim <= 1 or name in tokens else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 (N, H, W, 3) pixels scaled to [0, 1]."""
    x = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    return [round(float(v), 4) for v in x.mean(0)], [round(float(v), 4) for v in x.std(0)]


def to_device_tensor(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """uint8 (N, H, W, C) -> uint8 (N, C, H, W) on ``device`` (normalised per batch later)."""
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).to(device)


def normalise(batch: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 (B, C, H, W) -> float32 (x / 255 - mean) / std, as the server's preprocessing does."""
    return (batch.float() / 255.0 - mean) / std


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA; nothing on the CPU (float32 there)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    batch_size: int = 500,
) -> tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy) of ``model`` on uint8 (N, C, H, W) images, labels (N,)."""
    model.eval()
    losses, correct = 0.0, 0
    for start in range(0, len(images), batch_size):
        x, y = normalise(images[start : start + batch_size], mean, std), labels[start : start + batch_size]
        with autocast(images.device):
            logits = model(x).float()
        losses += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    return losses / len(images), correct / len(images)


def distillation_loss(student: nn.Module, teacher: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """DeiT's hard-label distillation (Touvron et al. 2021, Sec. 5.1, Eq. 3), a scalar:
    1/2 CE(class head, ``targets``) + 1/2 CE(distillation head, the teacher's argmax on ``x``).

    Args:
        student: a ViT with a distillation token (``forward(x, heads=True)``).
        teacher: any classifier, frozen.
        x: the augmented batch, float32 (B, C, H, W), normalised.
        targets: (B, K) soft targets of the true labels (smoothed, mixed).
    """
    with torch.no_grad():
        teacher_labels = teacher(x).argmax(dim=1)
    class_logits, distillation_logits = student(x, heads=True)
    hard = nn.functional.cross_entropy(distillation_logits.float(), teacher_labels)
    return 0.5 * soft_cross_entropy(class_logits, targets) + 0.5 * hard


def device_description(device: torch.device) -> str:
    """e.g. "cuda: NVIDIA H200" or "cpu: 2 threads, x86_64 (Intel Xeon ...)"."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    model_name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    return f"cpu: {torch.get_num_threads()} threads of {os.cpu_count()} cores, {model_name}"


def save_atomically(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename: a run killed mid-save
    (a sitting's time limit, a machine given back) leaves the previous ``path`` whole."""
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def train(
    out: Path,
    *,
    arch: str = "vit",
    epochs: int = 15,
    batch_size: int = 128,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    warmup_epochs: int = 2,
    label_smoothing: float = 0.1,
    mixup: float = 0.0,
    cutmix: float = 0.0,
    mix_prob: float = 1.0,
    erase: float = 0.0,
    teacher: Path | None = None,
    seed: int = 0,
    compile: bool = True,
    eval_every: int = 1,
    data: Path | None = None,
    limit_per_class: int | None = None,
    resume: bool = False,
    init: Path | None = None,
    upsample: int = 1,
    sitting_minutes: float | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train on CIFAR-10's training split, evaluate on its test split, write the run's files.

    Args:
        out: output folder.
        arch: "vit" (``models.vit.CONFIGS["cifar10"]``), "deit" (the same with a distillation
            token; needs ``teacher``) or "cnn" (``models.cnn.CONFIGS["cifar10"]``).
        erase: probability of random erasing per image (Zhong et al. 2020; DeiT uses 0.25).
        teacher: the distillation teacher's ``checkpoint.pt`` (``arch`` "deit" only).
        epochs: passes over the training split; the schedule is per step.
        eval_every: test-split evaluation every N epochs (and after the last).
        data: the JPEG archive (default: :func:`models.cifar.find_archive`).
        limit_per_class: use only N images per class of each split (quick runs, tests).
        resume: continue from ``out/last.pt`` if it exists.
        init: a ``checkpoint.pt`` of this script to start from (its weights only); its
            architecture and config must be ``arch``'s (``upsample`` aside). ``epochs`` then
            counts the new epochs, and the checkpoint's recipe is recorded "<its recipe>; then
            <this command>", as ``models.average_checkpoints`` records an average's.
        upsample: a ViT's ``models.vit.ViTConfig.upsample``: the grid made finer inside the model.
        sitting_minutes: end this call before an epoch that, at the last epoch's pace, would end
            past this many minutes of the call (``last.pt`` written; ``resume`` continues).

    Returns:
        The metrics written to ``metrics.json``; after a sitting that stopped before ``epochs``,
        only ``{"epoch": ..., "epochs": ...}`` (nothing but ``last.pt`` is written then).

    Raises:
        ValueError: ``teacher`` given without ``arch`` "deit" or missing with it; ``init`` is not
            a checkpoint of ``arch`` with the same config.
    """
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = seed_everything(seed)
    if (arch == "deit") != (teacher is not None):
        raise ValueError("--arch deit needs --teacher, and only it takes one")
    # the model and the checkpoints first, so a wrong flag fails before the data is decoded (which
    # draws nothing from the random generators: the initial weights are the same either way)
    teacher_model = load_teacher(teacher, device) if teacher is not None else None
    model, config = build_model(arch, upsample)
    started_from, earlier_recipe = load_init(model, config, arch, init) if init is not None else (None, None)
    model.to(device)

    train_split, test_split = load_cifar10_splits(data, limit_per_class)
    mean_list, std_list = channel_stats(train_split.images)
    preprocessing = {**PREPROCESSING, "mean": mean_list, "std": std_list}
    mean = torch.tensor(mean_list, device=device).view(1, 3, 1, 1)
    std = torch.tensor(std_list, device=device).view(1, 3, 1, 1)
    x_train, y_train = to_device_tensor(train_split.images, device), torch.from_numpy(train_split.labels).to(device)
    x_test, y_test = to_device_tensor(test_split.images, device), torch.from_numpy(test_split.labels).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    steps_per_epoch = len(x_train) // batch_size  # drop the last partial batch: one compiled shape
    total_steps = epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(total_steps, warmup_epochs * steps_per_epoch, floor=0.01)
    )
    # torch.compile of a module returns an OptimizedModule, an nn.Module; its stubs say a callable
    forward = cast(nn.Module, torch.compile(model)) if compile else model

    history: dict[str, list[tuple[float, float]]] = {
        "train loss": [],
        "test loss": [],
        "test accuracy": [],
        "learning rate": [],
    }
    first_epoch, elapsed, train_seconds, images_seen = 0, 0.0, 0.0, 0
    sittings: list[dict[str, Any]] = []
    last = out / "last.pt"
    if resume and last.exists():
        state = torch.load(last, map_location="cpu", weights_only=False)  # the generator stays on the CPU
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["generator"])
        history = {k: [tuple(p) for p in v] for k, v in state["history"].items()}
        first_epoch, elapsed = state["epoch"], state["elapsed"]
        train_seconds, images_seen = state["train_seconds"], state["images_seen"]
        # a last.pt from before sittings were recorded: its epochs, device unknown
        sittings = state.get("sittings", [{"epochs": [1, first_epoch], "device": None, "seconds": round(elapsed, 1)}])
        log.info("resumed %s at epoch %d (%.0f s done)", last, first_epoch, elapsed)

    log.info(
        "%s: %.2fM parameters, %d train / %d test images, %d epochs x %d steps, on %s",
        arch,
        parameters / 1e6,
        len(x_train),
        len(x_test),
        epochs,
        steps_per_epoch,
        device_description(device),
    )
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter() - elapsed
    sitting_started, last_epoch_total = time.perf_counter(), 0.0
    sitting: dict[str, Any] = {
        "epochs": [first_epoch + 1, first_epoch],
        "device": device_description(device),
        "seconds": 0.0,
    }
    sittings = [*sittings, sitting]
    for epoch in range(first_epoch, epochs):
        projected_end = time.perf_counter() - sitting_started + last_epoch_total
        if sitting_minutes is not None and epoch > first_epoch and projected_end > 60 * sitting_minutes:
            log.info("sitting ends before epoch %d (%.1f min); --resume continues", epoch + 1, sitting_minutes)
            return {"epoch": epoch, "epochs": epochs}
        iteration_started = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train), generator=generator).to(device)
        epoch_started, loss_sum = time.perf_counter(), torch.zeros((), device=device)
        for i in range(steps_per_epoch):
            index = order[i * batch_size : (i + 1) * batch_size]
            x = random_crop_flip(normalise(x_train[index], mean, std), generator)
            targets = soft_targets(y_train[index], len(CIFAR10_LABELS), label_smoothing)
            x, targets = mix(x, targets, generator, mixup_alpha=mixup, cutmix_alpha=cutmix, prob=mix_prob)
            if erase > 0:
                x = random_erase(x, generator, prob=erase)
            with autocast(device):
                if teacher_model is None:
                    loss = soft_cross_entropy(forward(x), targets)
                else:
                    loss = distillation_loss(forward, teacher_model, x, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            loss = loss.detach()
            loss_sum += loss
            if not quiet and (i + 1) % 50 == 0:
                rate = (i + 1) * batch_size / (time.perf_counter() - epoch_started)
                log.info(
                    "epoch %d step %d/%d loss %.3f (%.0f img/s)", epoch + 1, i + 1, steps_per_epoch, loss.item(), rate
                )
        epoch_seconds = time.perf_counter() - epoch_started
        train_seconds += epoch_seconds
        images_seen += steps_per_epoch * batch_size
        history["train loss"].append((epoch + 1, float(loss_sum) / steps_per_epoch))
        history["learning rate"].append((epoch + 1, float(schedule.get_last_lr()[0])))
        if (epoch + 1) % eval_every == 0 or epoch + 1 == epochs:
            test_loss, test_accuracy = evaluate(forward, x_test, y_test, mean, std)
            history["test loss"].append((epoch + 1, test_loss))
            history["test accuracy"].append((epoch + 1, test_accuracy))
            log.info("epoch %d: test loss %.3f, test accuracy %.4f", epoch + 1, test_loss, test_accuracy)
        log.info(
            "epoch %d/%d: train loss %.3f, %.0f s, %.0f img/s, %.1f min so far",
            epoch + 1,
            epochs,
            history["train loss"][-1][1],
            epoch_seconds,
            steps_per_epoch * batch_size / epoch_seconds,
            (time.perf_counter() - started) / 60,
        )
        sitting["epochs"][1], sitting["seconds"] = epoch + 1, round(time.perf_counter() - sitting_started, 1)
        save_atomically(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "generator": generator.get_state(),
                "history": history,
                "epoch": epoch + 1,
                "elapsed": time.perf_counter() - started,
                "train_seconds": train_seconds,
                "images_seen": images_seen,
                "sittings": sittings,
            },
            last,
        )
        last_epoch_total = time.perf_counter() - iteration_started

    wall_seconds = time.perf_counter() - started
    test_loss, test_accuracy = evaluate(model, x_test, y_test, mean, std)
    metrics: dict[str, Any] = {
        "test_accuracy": test_accuracy,
        **(
            {"teacher": str(teacher), "teacher_test_accuracy": evaluate(teacher_model, x_test, y_test, mean, std)[1]}
            if teacher_model
            else {}
        ),
        "test_loss": round(test_loss, 4),
        "train_loss_last_epoch": round(history["train loss"][-1][1], 4),
        "wall_seconds": round(wall_seconds, 1),
        "train_seconds": round(train_seconds, 1),
        "train_images_per_second": round(images_seen / max(train_seconds, 1e-9), 1),
        "device": device_description(device),
        "torch_version": torch.__version__,
        "compiled": compile,
        "parameters": parameters,
        "epochs": epochs,
        "batch_size": batch_size,
        "train_images": len(x_train),
        "test_images": len(x_test),
        "seed": seed,
        "sittings": sittings,
        **(started_from or {}),
    }
    name = f"{arch}-cifar10"
    recipe = "python -m models.train_cifar " + shlex.join(sys.argv[1:])
    if earlier_recipe:  # --init: the recipe of the weights it started from first, as models.average_checkpoints'
        recipe = f"{earlier_recipe}; then {recipe}"
    torch.save(
        {
            "architecture": arch,
            "dataset": "cifar10",
            "config": config,
            "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},  # loads where no GPU is
            "labels": CIFAR10_LABELS,
            "preprocessing": preprocessing,
            "metrics": metrics,
            "training_data": TRAINING_DATA
            if limit_per_class is None
            else f"{TRAINING_DATA}; first {limit_per_class} per class",
            "recipe": recipe,
            "torch_version": torch.__version__,
        },
        out / "checkpoint.pt",
    )
    write_json(metrics, out / "metrics.json")
    write_json({k: [list(p) for p in v] for k, v in history.items()}, out / "history.json")
    plot_curves(
        history,
        out / "training_curves.png",
        f"{name}: test accuracy {test_accuracy:.4f}, {wall_seconds / 60:.0f} min on {device.type}",
        xlabel="epoch",
    )
    last.unlink(missing_ok=True)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, default="vit")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/<arch>-cifar10")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--mixup", type=float, default=0.0, help="Mixup alpha (0: off)")
    parser.add_argument("--cutmix", type=float, default=0.0, help="CutMix alpha (0: off)")
    parser.add_argument("--erase", type=float, default=0.0, help="random erasing probability (DeiT: 0.25)")
    parser.add_argument("--teacher", type=Path, default=None, help="--arch deit: the teacher's checkpoint.pt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: PyTorch's, one per core); 1 on a busy machine"
    )
    parser.add_argument("--data", type=Path, default=None, help="cifar10-jpeg.zip (default: ../shared/data/)")
    parser.add_argument("--limit-per-class", type=int, default=None, help="quick runs: N images per class")
    parser.add_argument("--resume", action="store_true", help="continue from <out>/last.pt")
    parser.add_argument(
        "--init", type=Path, default=None, help="start from this checkpoint.pt's weights (fresh optimizer and schedule)"
    )
    parser.add_argument(
        "--upsample", type=int, default=1, help="a ViT's input enlarged N times inside it (a finer grid); 1: none"
    )
    parser.add_argument(
        "--sitting-minutes", type=float, default=None, help="end this call before an epoch would end past M minutes"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = args.out or Path("runs") / f"{args.arch}-cifar10"
    metrics = train(
        out,
        arch=args.arch,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs,
        label_smoothing=args.label_smoothing,
        mixup=args.mixup,
        cutmix=args.cutmix,
        erase=args.erase,
        teacher=args.teacher,
        seed=args.seed,
        compile=not args.no_compile,
        eval_every=args.eval_every,
        data=args.data,
        limit_per_class=args.limit_per_class,
        resume=args.resume,
        init=args.init,
        upsample=args.upsample,
        sitting_minutes=args.sitting_minutes,
    )
    if "test_accuracy" not in metrics:
        print(f"stopped after epoch {metrics['epoch']} of {metrics['epochs']}; continue with --resume")
        return
    print(
        f"{args.arch}: test accuracy {metrics['test_accuracy']:.4f} in {metrics['wall_seconds'] / 60:.1f} min "
        f"({metrics['train_images_per_second']} img/s, {metrics['device']}); wrote {out}"
    )


if __name__ == "__main__":
    main()
