"""Measure an exported graph on held-out data exactly as the server will run it.

The images go through the server's own preprocessing (:class:`service.imaging.preprocess.Preprocessor`)
and ONNX Runtime, so the accuracy written into the manifest is the served model's accuracy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from models.datasets import Split
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing


def pil_image(pixels: np.ndarray) -> Image.Image:
    """uint8 (H, W) or (H, W, 3) -> a Pillow "L" or "RGB" image."""
    return Image.fromarray(pixels, mode="L" if pixels.ndim == 2 else "RGB")


def predict(path: Path, preprocessing: Preprocessing, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Top-1 class ids, int64 (N,), of the ONNX classifier at ``path`` on uint8 ``images``."""
    preprocess = Preprocessor(preprocessing)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    predictions = []
    for start in range(0, len(images), batch_size):
        batch = np.stack([preprocess(pil_image(p)) for p in images[start : start + batch_size]])  # (B, C, H, W)
        (logits,) = session.run(None, {input_name: batch})[:1]
        predictions.append(np.argmax(logits, axis=1))
    return np.concatenate(predictions)


def accuracy(path: Path, preprocessing: Preprocessing, split: Split) -> float:
    """Top-1 accuracy of the ONNX classifier on ``split``."""
    return float(np.mean(predict(path, preprocessing, split.images) == split.labels))
