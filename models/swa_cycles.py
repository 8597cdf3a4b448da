"""Stochastic weight averaging over short cosine cycles, from a finished CIFAR-10 run.

    python -m models.swa_cycles runs/gpu/deit-t40-150-wr80/checkpoint.pt --out runs/deit-cifar10-swa \
        --arch deit --teacher models/weights/cnn-cifar10-40ep.pt --cycles 12 --lr 2e-4 --erase 0.25

SWA (Izmailov et al., "Averaging Weights Leads to Wider Optima and Better Generalization",
UAI 2018, Sec. 3.1-3.2): from a trained network, run a cyclical learning-rate schedule and
average the weights reached at the end of each cycle, where the rate is lowest; the average lies
nearer the centre of the wide, flat region those points sample, and generalises better than any
one of them. Here a cycle is one epoch of ``models.train_cifar`` started from the cycle before's
weights (``--init``: a fresh AdamW, no warm-up, cosine from ``--lr`` down to 1 % of it), with the
same recipe as the run (distillation, augmentations) and a new seed (``--seed`` + k: another
order of the training split and other augmentations). The average is
``models.average_checkpoints``' (uniform mean of the cycle ends, the conv stem's BatchNorm
re-estimated on the training split augmented as the cycles trained), and its test accuracy is
measured once, at the end.

Resumable by cycle: a cycle whose ``cycle-<k>/checkpoint.pt`` exists is not run again (a killed
cycle restarts from its beginning: one epoch). Writes ``cycle-1`` ... ``cycle-N`` (each a run of
``models.train_cifar``), and in ``--out`` the average's ``checkpoint.pt`` (for ``python -m export
checkpoint``), ``metrics.json`` (``models.average_checkpoints``' and each cycle's test accuracy, the
start's, the recipe) and ``training_curves.png`` (each cycle end's test accuracy and train loss).
"""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import Any

import torch

from models.average_checkpoints import average
from models.train_cifar import ARCHITECTURES, train
from models.training import plot_curves, write_json

log = logging.getLogger(__name__)


def run_cycles(
    start: Path,
    out: Path,
    *,
    cycles: int,
    lr: float,
    seed: int = 100,
    data: Path | None = None,
    limit_per_class: int | None = None,
    **recipe: Any,
) -> dict[str, Any]:
    """Run ``cycles`` one-epoch cosine cycles from ``start``'s weights, then average their ends.

    Args:
        start: a ``checkpoint.pt`` of ``models.train_cifar`` (the finished run).
        out: output folder (``out/cycle-<k>`` for the cycles, the average in ``out``).
        cycles: how many cycle ends are averaged (≥ 2).
        lr: each cycle's peak learning rate (its first step; cosine to 1 % of it at its end).
        seed: cycle k runs with seed ``seed + k``.
        recipe: the rest of :func:`models.train_cifar.train`'s arguments (``arch``, ``teacher``,
            ``erase``, ``batch_size``, ``compile``, ...), the same for every cycle.

    Returns:
        The average's metrics (``out/metrics.json``).

    Raises:
        ValueError: fewer than 2 cycles; as :func:`models.train_cifar.train` and
            :func:`models.average_checkpoints.average`.
    """
    if cycles < 2:
        raise ValueError("averaging needs at least two cycles")
    previous = start
    ends: list[Path] = []
    for k in range(1, cycles + 1):
        folder = out / f"cycle-{k}"
        if not (folder / "checkpoint.pt").exists():
            log.info("cycle %d of %d from %s", k, cycles, previous)
            train(
                folder,
                epochs=1,
                lr=lr,
                warmup_epochs=0,
                seed=seed + k,
                init=previous,
                data=data,
                limit_per_class=limit_per_class,
                **recipe,
            )
        previous = folder / "checkpoint.pt"
        ends.append(previous)
    metrics = average(ends, out, erase=recipe.get("erase", 0.0), data=data, limit_per_class=limit_per_class)
    started = torch.load(start, map_location="cpu", weights_only=False)["metrics"]
    accuracies = metrics["averaged_test_accuracies"]
    runs = [torch.load(end, map_location="cpu", weights_only=False)["metrics"] for end in ends]
    losses = [run["train_loss_last_epoch"] for run in runs]
    metrics |= {
        "start": str(start),
        "start_test_accuracy": started["test_accuracy"],
        "start_epochs": started["epochs"],
        "cycles": cycles,
        "cycle_lr": lr,
        "cycle_seeds": [seed + k for k in range(1, cycles + 1)],
        # the command line, with the flags this module has (the tests' small runs pass more)
        "recipe": shlex.join(
            ["python", "-m", "models.swa_cycles", str(start), "--out", str(out), "--cycles", str(cycles)]
            + ["--lr", str(lr), "--seed", str(seed)]
            + [f"--{key}={recipe[key]}" for key in ("arch", "teacher", "erase") if recipe.get(key) is not None]
        ),
    }
    write_json(metrics, out / "metrics.json")
    plot_curves(
        {
            "test accuracy at each cycle's end": [(0, started["test_accuracy"])]
            + [(k + 1, a) for k, a in enumerate(accuracies)],
            "train loss of each cycle": [(k + 1, loss) for k, loss in enumerate(losses)],
        },
        out / "training_curves.png",
        f"SWA over {cycles} one-epoch cycles (lr {lr:g}): the average {metrics['test_accuracy']:.4f}",
        xlabel="cycle (0: the start)",
    )
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("start", type=Path, help="checkpoint.pt of a finished models.train_cifar run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arch", choices=ARCHITECTURES, required=True)
    parser.add_argument("--teacher", type=Path, default=None, help="--arch deit: the teacher's checkpoint.pt")
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--erase", type=float, default=0.0, help="random erasing probability (DeiT: 0.25)")
    parser.add_argument("--seed", type=int, default=100, help="cycle k runs with seed + k")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: one per core)")
    parser.add_argument("--data", type=Path, default=None, help="cifar10-jpeg.zip (default: ../shared/data/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    metrics = run_cycles(
        args.start,
        args.out,
        cycles=args.cycles,
        lr=args.lr,
        seed=args.seed,
        data=args.data,
        arch=args.arch,
        teacher=args.teacher,
        erase=args.erase,
    )
    print(
        f"SWA of {args.cycles} cycles: test accuracy {metrics['test_accuracy']:.4f} "
        f"(start {metrics['start_test_accuracy']:.4f}, cycles {metrics['averaged_test_accuracies']}); wrote {args.out}"
    )


if __name__ == "__main__":
    main()
