"""Does a detr-digits checkpoint's box size depend on the canvas's extent? (issue 21)

    python -m models.box_bias runs/detr-experiments/baseline/checkpoint.pt

Runs the checkpoint on the validation canvases through its own input format (as its training
evaluated it), keeps the detections at the detect route's default threshold 0.5, pairs each
ground-truth box with the same-label detection of highest IoU (at least 0.3), and prints, per
range of the model input's width and height (after the format's resize, before padding), the
median ratio of the predicted to the true box width (height) and the mean IoU. A model that
knows each canvas's extent has ratios near 1 in every range; one that normalises its boxes by a
guess of the extent over- or under-sizes them on the canvases it guesses wrong.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

RANGES = ((60, 80), (80, 96), (96, 112), (112, 129))  # pixels of the model input's side


def matched_pairs(
    truth: Sequence[tuple[np.ndarray, np.ndarray]], detections: Sequence[Sequence[dict[str, Any]]], labels: list[str]
) -> list[tuple[int, np.ndarray, np.ndarray, float]]:
    """(image index, true xyxy, predicted xyxy, IoU) per true box that has a same-label detection with IoU >= 0.3.

    Args:
        truth: per image, (boxes float (M, 4) xyxy pixels, labels int (M,)).
        detections: per image, the detect route's detections (``label``, ``box`` xmin/ymin/xmax/ymax).
        labels: class index -> the label the detections carry.
    """
    from models.detection_eval import pairwise_iou

    pairs = []
    for index, ((boxes, classes), found) in enumerate(zip(truth, detections, strict=True)):
        if not found:
            continue
        predicted = np.array([[d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for d in found], np.float64)
        predicted_labels = [d["label"] for d in found]
        overlap = pairwise_iou(np.asarray(boxes, np.float64).reshape(-1, 4), predicted)  # (M, D)
        for box, label, row in zip(boxes, classes, overlap, strict=True):
            same = np.array([name == labels[int(label)] for name in predicted_labels])
            scores = np.where(same, row, 0.0)
            best = int(np.argmax(scores))
            if scores[best] >= 0.3:
                pairs.append((index, np.asarray(box, np.float64), predicted[best], float(scores[best])))
    return pairs


def size_ratio_table(pairs: list[tuple[int, np.ndarray, np.ndarray, float]], sides: np.ndarray) -> list[str]:
    """Lines of the table: per range of the input's width (height), n, mean IoU, median predicted / true width (height).

    Args:
        pairs: :func:`matched_pairs`.
        sides: float (N, 2), each image's model-input (width, height) in pixels.
    """
    lines = [
        "axis | input side, px | pairs | mean IoU | predicted / true size, median (IQR)",
        "--- | --- | --- | --- | ---",
    ]
    for axis, name in ((0, "width"), (1, "height")):
        side = np.array([sides[i, axis] for i, *_ in pairs])
        ratio = np.array([(p[2 + axis] - p[axis]) / (t[2 + axis] - t[axis]) for _, t, p, _ in pairs])
        iou = np.array([q for *_, q in pairs])
        for low, high in RANGES:
            sel = (side >= low) & (side < high)
            if not sel.any():
                continue
            q75, q25 = np.percentile(ratio[sel], [75, 25])
            summary = f"{iou[sel].mean():.3f} | {np.median(ratio[sel]):.3f} ({q75 - q25:.3f})"
            lines.append(f"{name} | {low}-{high - 1} | {sel.sum()} | {summary}")
    return lines


def input_format(checkpoint: dict[str, Any]) -> str:
    """The ``models.detr_inputs.INPUT_FORMATS`` name a checkpoint was trained with, from its preprocessing."""
    spec = checkpoint.get("preprocessing", {})
    if not checkpoint.get("pixel_mask"):
        return "letterbox"
    if spec.get("resize") == "shortest_edge":
        return "resized-served" if spec.get("trained_on_served_buckets") else "resized-bucket"
    return "bucket" if spec.get("pad_to") == "bucket" else "padded"


def main(argv: list[str] | None = None) -> None:
    import torch

    from models.detection_data import load_split
    from models.detr import DETR, config_from_dict
    from models.detr_inputs import INPUT_FORMATS, MAX_SIZE, enlarge
    from models.train_detr import torch_runner

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint.pt of models.train_detr")
    parser.add_argument("--inputs", default=None, help="its input format (default: from its preprocessing)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    model = DETR(config_from_dict(checkpoint["config"]))
    model.load_state_dict(checkpoint["state_dict"])
    name = args.inputs or input_format(checkpoint)
    canvases = load_split("val")
    labels = list(checkpoint["labels"])
    detections = INPUT_FORMATS[name].detections(
        torch_runner(model.eval()), canvases, labels, checkpoint.get("postprocess", "softmax"), threshold=0.5
    )
    sides = []
    for canvas in canvases:
        pixels = enlarge(canvas.image, MAX_SIZE) if name.startswith("resized") else canvas.image
        sides.append((pixels.shape[1], pixels.shape[0]))  # the canvas's own size but for resized inputs
    pairs = matched_pairs([(c.boxes, c.labels) for c in canvases], detections, labels)
    print(
        f"{args.checkpoint} ({name} inputs): {len(pairs)} of {sum(len(c.labels) for c in canvases)} val objects matched"
    )
    print("\n".join(size_ratio_table(pairs, np.array(sides, np.float64))))


if __name__ == "__main__":
    main()
