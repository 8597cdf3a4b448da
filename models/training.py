"""Pieces every training command shares: seeding, the schedule, the curves, the metrics file."""

from __future__ import annotations

import json
import math
import os
import platform
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, numpy and torch; returns a torch generator for data order."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def warmup_cosine(total_steps: int, warmup_steps: int, floor: float = 0.0) -> Callable[[int], float]:
    """LambdaLR multiplier: linear warm-up from ~0 to 1 over ``warmup_steps``, then cosine decay to ``floor``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def plot_curves(history: dict[str, list[tuple[float, float]]], path: Path, title: str, xlabel: str = "step") -> None:
    """One panel per series: ``history[name] = [(x, value), ...]`` against ``xlabel``; written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(history), figsize=(4.5 * len(history), 3.4), squeeze=False)
    for ax, (name, points) in zip(axes[0], history.items(), strict=True):
        steps, values = zip(*points, strict=True) if points else ((), ())
        ax.plot(steps, values, marker="." if len(points) < 60 else None)
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(data: dict, path: Path) -> None:
    """Indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def machine() -> str:
    """The CPU this runs on, in words: model name, cores this process may use, load."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores available, load {os.getloadavg()[0]:.1f} at the end"
