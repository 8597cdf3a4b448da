"""CIFAR-10 (Krizhevsky 2009) from the project's JPEG archive, as uint8 pixels.

The archive (``cifar10-jpeg.zip``) holds 50,000 train and 10,000 test 32x32 RGB JPEGs under
``train|test/<class>/NNNN.jpg``. Decoding all 60,000 takes ~10 s on one core, so nothing is
cached. Training, export-time evaluation and the tests start from the same decoded pixels
(the JPEGs decoded by Pillow, exactly what the server does with an upload).
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from models.datasets import Split

# The standard CIFAR-10 class order, which is also the archive's folders sorted by name.
CIFAR10_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

_ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "PATCHSERVE_CIFAR10"
# Where the archive is looked for when neither an argument nor $PATCHSERVE_CIFAR10 names it:
# ../shared/data beside a checkout (the main checkout), ../../shared/data beside a worktree.
CANDIDATES = (
    _ROOT.parent / "shared" / "data" / "cifar10-jpeg.zip",
    _ROOT.parents[1] / "shared" / "data" / "cifar10-jpeg.zip",
    _ROOT / "shared" / "data" / "cifar10-jpeg.zip",
)


def find_archive(path: Path | str | None = None) -> Path:
    """The CIFAR-10 JPEG archive: ``path``, else ``$PATCHSERVE_CIFAR10``, else the first of ``CANDIDATES``.

    Raises:
        FileNotFoundError: none of them exists; the message lists where it looked.
    """
    tried = [Path(path)] if path is not None else []
    if not tried and os.environ.get(ENV_VAR):
        tried = [Path(os.environ[ENV_VAR])]
    tried = tried or list(CANDIDATES)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"CIFAR-10 archive not found (looked at {', '.join(map(str, tried))}); pass its path or set {ENV_VAR}"
    )


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # (32, 32, 3) uint8


def load_split(split: str, path: Path | str | None = None, limit_per_class: int | None = None) -> Split:
    """One split of the archive, in a fixed order (class by class, file names sorted).

    Args:
        split: "train" (50,000 images) or "test" (10,000).
        path: the archive (see :func:`find_archive`).
        limit_per_class: keep only the first N images of each class (for quick runs and tests).

    Returns:
        images uint8 (N, 32, 32, 3) RGB; labels int64 (N,) indexing ``CIFAR10_LABELS``.

    Raises:
        FileNotFoundError: no archive.
        ValueError: ``split`` unknown, or the archive holds a class folder not in ``CIFAR10_LABELS``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    with zipfile.ZipFile(find_archive(path)) as archive:
        by_class: dict[str, list[str]] = {}
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == split and parts[2].lower().endswith((".jpg", ".jpeg")):
                if parts[1] not in CIFAR10_LABELS:
                    raise ValueError(f"{name}: class {parts[1]!r} is not a CIFAR-10 class")
                by_class.setdefault(parts[1], []).append(name)
        images: list[np.ndarray] = []
        labels: list[int] = []
        for class_id, label in enumerate(CIFAR10_LABELS):
            names = sorted(by_class.get(label, []))[:limit_per_class]
            images.extend(_decode(archive.read(name)) for name in names)
            labels.extend([class_id] * len(names))
    return Split(np.stack(images), np.asarray(labels, dtype=np.int64))


def load_cifar10_splits(path: Path | str | None = None, limit_per_class: int | None = None) -> tuple[Split, Split]:
    """(train, test): 50,000 and 10,000 images uint8 (N, 32, 32, 3) with int64 labels."""
    return load_split("train", path, limit_per_class), load_split("test", path, limit_per_class)
