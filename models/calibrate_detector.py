"""Platt scaling of a sigmoid detector's class scores, fit on the validation split.

A served sigmoid detector (``task_options.scores`` ``sigmoid_top_k``) scores each (query, class)
pair ``sigmoid(logit)``. Platt scaling (Platt 1999, "Probabilistic outputs for support vector
machines", Sec. 2; for detectors, Küppers et al. 2020, "Multivariate confidence calibration for
object detection", CVPR workshops) replaces it by ``sigmoid(scale * logit + shift)``, the two
numbers fit by maximum likelihood so that a score estimates the probability that the detection
is correct: on the val split, every candidate the server returns at ``threshold=0`` (the
``top_k`` best pairs of each canvas) is labelled 1 when COCO's greedy matching at IoU 0.5
(:func:`models.detection_eval.match_greedy`) makes it a true positive, else 0 (duplicates
included), and a logistic regression of that label on the logit gives ``scale`` and ``shift``.

The transformation is monotone (``scale`` > 0), so the order of detections and COCO AP do not
change; what changes is which detections clear a fixed threshold: a calibrated score of at least
``t`` is a raw score of at least ``sigmoid((logit(t) - shift) / scale)`` (recorded as
``calibration_raw_threshold``). It is baked into the graph as two nodes after ``pred_logits``
(``Mul`` by ``scale``, ``Add`` of ``shift``), so the server, its score rule and its default
threshold are unchanged:

    python -m models.calibrate_detector model_repository/detr-digits/3 --to model_repository/detr-digits/4 \\
        --docs docs/detr-digits-experiments/calibrated

writes the calibrated graph, its manifest (the source's, with the val and test figures measured
again through ONNX Runtime with the served preprocessing, and the recipe extended) and
``metrics.json``, and prints the reliability of the scores before and after on both splits.
The test split is only measured, never fit.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.detection_eval import (
    coco_ap,
    detect_images,
    detection_arrays,
    match_greedy,
    object_arrays,
    objects_by_image,
    served_rule,
    set_quality,
)

LOGITS = "pred_logits"
# Scores are float64 sigmoids of float32 logits; clipped here so that a saturated score (about |logit| > 36)
# has a finite logit.
_EPS = 1e-15
# set_quality's figures that the manifest records (at the detect route's default threshold).
_AT_THRESHOLD = (
    "duplicate_canvas_fraction",
    "duplicate_pairs",
    "precision",
    "recall",
    "missed",
    "missed_scored_below_threshold",
)
RELIABILITY_BINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def candidates(
    ground_truth: dict[str, Any], detections: Sequence[Sequence[dict[str, Any]]], *, iou: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Every detection of every image as (logit, correct): the samples Platt scaling is fit on.

    Args:
        ground_truth: a COCO instances dict; ``bbox`` [x, y, width, height] in pixels.
        detections: per image of ``ground_truth["images"]``, the server's detections (all of
            them: those at ``threshold=0``), each with a sigmoid ``score``.
        iou: the matching IoU.

    Returns:
        float64 (N,) logits (scores' inverse sigmoid, scores clipped to [1e-15, 1 - 1e-15]) and
        int (N,) 1 where the detection is a true positive by :func:`match_greedy`, else 0.
    """
    images = ground_truth["images"]
    if len(detections) != len(images):
        raise ValueError(f"{len(detections)} detection lists for {len(images)} images")
    objects_of = objects_by_image(ground_truth)
    scores: list[float] = []
    correct: list[np.ndarray] = []
    for image, dets in zip(images, detections, strict=True):
        ranked = sorted(dets, key=lambda d: -d["score"])
        boxes, labels = detection_arrays(ranked)
        true_positive, _ = match_greedy(boxes, labels, *object_arrays(objects_of[image["id"]]), iou=iou)
        scores.extend(d["score"] for d in ranked)
        correct.append(true_positive)
    p = np.clip(np.asarray(scores, np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p), np.concatenate(correct).astype(int) if correct else np.zeros(0, int)


def fit_platt(logits: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """``(scale, shift)`` maximising the likelihood of ``correct`` under ``sigmoid(scale * logit + shift)``.

    An unregularised logistic regression (scikit-learn, L-BFGS) of the label on the logit.

    Args:
        logits: float (N,) raw logits.
        correct: int or bool (N,) labels, both classes present.

    Raises:
        ValueError: one class only, or a fit whose scale is not positive (it would reverse the
            order of detections).
    """
    from sklearn.linear_model import LogisticRegression

    y = np.asarray(correct).astype(int)
    if len(np.unique(y)) != 2:
        raise ValueError("Platt scaling needs both correct and wrong detections")
    model = LogisticRegression(C=np.inf, solver="lbfgs", max_iter=1000, tol=1e-10)  # C=inf: no penalty
    model.fit(np.asarray(logits, np.float64).reshape(-1, 1), y)
    scale, shift = float(model.coef_[0, 0]), float(model.intercept_[0])
    if scale <= 0:
        raise ValueError(f"the fit scale {scale:.4g} is not positive: the scores carry no ranking to keep")
    return scale, shift


def negative_log_likelihood(logits: np.ndarray, correct: np.ndarray, scale: float = 1.0, shift: float = 0.0) -> float:
    """Mean binary cross-entropy (nats per detection) of ``sigmoid(scale * logit + shift)`` against ``correct``."""
    z = scale * np.asarray(logits, np.float64) + shift
    return float(np.mean(np.logaddexp(0.0, z) - np.asarray(correct) * z))


def reliability(
    logits: np.ndarray, correct: np.ndarray, scale: float = 1.0, shift: float = 0.0
) -> list[tuple[float, float, int, float]]:
    """Per :data:`RELIABILITY_BINS` bin of the score: (low, high, detections, fraction correct); empty bins left out."""
    scores = 1 / (1 + np.exp(-(scale * np.asarray(logits, np.float64) + shift)))
    rows = []
    for low, high in itertools.pairwise(RELIABILITY_BINS):
        inside = (scores >= low) & ((scores < high) if high < 1 else (scores <= high))
        if inside.any():
            rows.append((low, high, int(inside.sum()), float(np.mean(np.asarray(correct)[inside]))))
    return rows


def calibrated_graph(source: Path, target: Path, scale: float, shift: float, output: str = LOGITS) -> None:
    """Copy the ONNX graph at ``source`` to ``target`` with ``output`` replaced by ``scale * output + shift``.

    The node that made ``output`` now makes ``<output>_uncalibrated``; a ``Mul`` and an ``Add``
    (float32 scalar initializers ``<output>_calibration_scale`` and ``_shift``) make ``output``
    from it, so the graph's inputs and outputs keep their names, order, shapes and dtypes.

    Raises:
        ValueError: the graph has no output ``output``.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    if output not in {o.name for o in graph.output}:
        raise ValueError(f"{source} has no output {output!r}")
    raw, scaled = f"{output}_uncalibrated", f"{output}_scaled"
    for node in graph.node:
        node.input[:] = [raw if name == output else name for name in node.input]
        node.output[:] = [raw if name == output else name for name in node.output]
    scale_name, shift_name = f"{output}_calibration_scale", f"{output}_calibration_shift"
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(scale, np.float32), scale_name),
            numpy_helper.from_array(np.array(shift, np.float32), shift_name),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Mul", [raw, scale_name], [scaled], name="platt_scale"),
            helper.make_node("Add", [scaled, shift_name], [output], name="platt_shift"),
        ]
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(target))


def _measure(run: Any, manifest: Any, split: str, count: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """AP, set quality at the route's default threshold, and the Platt samples of one split."""
    from models.detection_data import load_split, to_coco
    from service.tasks.detection import DEFAULT_THRESHOLD

    canvases = load_split(split, None, count)
    detections = detect_images(
        run, [c.image for c in canvases], manifest.preprocessing, manifest.labels, postprocess=served_rule(manifest)
    )
    ground_truth = to_coco(canvases)
    figures = {
        **coco_ap(ground_truth, detections),
        **set_quality(ground_truth, detections, threshold=DEFAULT_THRESHOLD),
    }
    return figures, *candidates(ground_truth, detections)


def calibrate(
    source: Path, target: Path, *, docs: Path | None = None, val_count: int = 500, test_count: int = 500
) -> dict[str, Any]:
    """Fit Platt scaling of ``source``'s scores on val and write the calibrated version to ``target``.

    Args:
        source: a served sigmoid detector's version folder (``model.onnx``, ``model.json``,
            ``metrics.json``).
        target: the new version folder (created; its ``model.onnx``, ``model.json``,
            ``metrics.json`` and a copy of ``training_curves.png`` if the source has one).
        docs: a folder for ``reliability.md`` (:func:`reliability_table`) and ``calibration.json``
            (the returned figures), or None.
        val_count, test_count: canvases of each split (the manifests' 500).

    Returns:
        The calibration's figures (also in the new manifest's ``provenance.metrics``).

    Raises:
        ValueError: ``source`` is not a sigmoid detector, or the fit fails (:func:`fit_platt`).
    """
    from export.detr import onnx_runner
    from service.runtime.manifest import Provenance, load_manifest, write_manifest
    from service.tasks.detection import DEFAULT_THRESHOLD

    manifest = load_manifest(source / "model.json")
    if served_rule(manifest) != "sigmoid_top_k":
        raise ValueError(f"{source} is served by {served_rule(manifest)!r}; Platt scaling here needs sigmoid_top_k")
    started = time.perf_counter()
    raw = onnx_runner(source / "model.onnx")
    _, val_logits, val_correct = _measure(raw, manifest, "val", val_count)
    scale, shift = fit_platt(val_logits, val_correct)
    target.mkdir(parents=True, exist_ok=True)
    calibrated_graph(source / "model.onnx", target / "model.onnx", scale, shift)
    run = onnx_runner(target / "model.onnx")
    val, _, _ = _measure(run, manifest, "val", val_count)
    test, test_logits, test_correct = _measure(run, manifest, "test", test_count)
    test_logits = (test_logits - shift) / scale  # the calibrated graph's detections, back to raw logits
    threshold_logit = np.log(DEFAULT_THRESHOLD) - np.log1p(-DEFAULT_THRESHOLD)
    calibration = {
        "calibration_scale": scale,
        "calibration_shift": shift,
        "calibration_raw_threshold": float(1 / (1 + np.exp(-(threshold_logit - shift) / scale))),
        "calibration_val_candidates": float(len(val_logits)),
        "calibration_val_nll_raw": negative_log_likelihood(val_logits, val_correct),
        "calibration_val_nll": negative_log_likelihood(val_logits, val_correct, scale, shift),
        "calibration_test_nll_raw": negative_log_likelihood(test_logits, test_correct),
        "calibration_test_nll": negative_log_likelihood(test_logits, test_correct, scale, shift),
        "calibration_seconds": round(time.perf_counter() - started, 1),
    }
    metrics = {
        **manifest.provenance.metrics,
        "test_AP": test["AP"],
        "test_AP50": test["AP50"],
        "test_AP75": test["AP75"],
        "test_AR100": test["AR100"],
        **{f"test_{k}": test[k] for k in _AT_THRESHOLD},
        **calibration,
    }
    command = f"python -m models.calibrate_detector {source} --to {target}"
    provenance = manifest.provenance
    new = manifest.model_copy(
        update={
            "description": manifest.description + f"; class scores Platt-scaled on val (from version {source.name})",
            "provenance": Provenance(
                training_data=provenance.training_data,
                recipe=f"{provenance.recipe}; then {command}",
                metrics=metrics,
                export=provenance.export,
                notes=provenance.notes
                + f" Version {source.name}'s graph with its class logits Platt-scaled (models.calibrate_detector: "
                f"scale {scale:.4f}, shift {shift:.4f}, fit by maximum likelihood on the {len(val_logits):,} "
                f"candidates of the val split, test only measured): a calibrated score of {DEFAULT_THRESHOLD} is a "
                f"raw score of {calibration['calibration_raw_threshold']:.4f}; export parity is version "
                f"{source.name}'s.",
            ),
        }
    )
    write_manifest(new, target / "model.json")
    trained = json.loads((source / "metrics.json").read_text()) if (source / "metrics.json").exists() else {}
    val_figures = {f"val_{k}": val[k] for k in ("AP", "AP50", "duplicate_canvas_fraction", "precision", "recall")}
    # The source's training record (its PyTorch AP stands: calibration keeps every ranking), its figures at the
    # default threshold and on val replaced by this version's (a fresh user's find: they were version 3's).
    test_figures = {f"test_{k}": test[k] for k in _AT_THRESHOLD}
    (target / "metrics.json").write_text(
        json.dumps({**trained, **test_figures, **val_figures, **calibration}, indent=2) + "\n"
    )
    if (source / "training_curves.png").exists():
        shutil.copyfile(source / "training_curves.png", target / "training_curves.png")
    figures = {**calibration, **val_figures, **{f"test_{k}": v for k, v in test.items()}}
    table = reliability_table(val_logits, val_correct, test_logits, test_correct, scale, shift)
    print(table)
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        (docs / "reliability.md").write_text(
            f"Scores of `{source}` (raw) and of `{target}` (calibrated: scale {scale:.4f}, shift {shift:.4f}, "
            f"fit on val), by bin, against the fraction of detections that are correct (greedy matching, IoU 0.5, "
            f"same label), over every candidate the server returns at threshold 0. Written by `{command} "
            f"--docs {docs}`.\n\n{table}"
        )
        (docs / "calibration.json").write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def reliability_table(
    val_logits: np.ndarray,
    val_correct: np.ndarray,
    test_logits: np.ndarray,
    test_correct: np.ndarray,
    scale: float,
    shift: float,
) -> str:
    """The reliability of raw and calibrated scores on val and test, as a markdown table."""
    lines = ["| split | scores | bin | detections | fraction correct |", "| --- | --- | --- | --- | --- |"]
    for split, logits, correct in (("val", val_logits, val_correct), ("test", test_logits, test_correct)):
        for name, (a, b) in (("raw", (1.0, 0.0)), ("calibrated", (scale, shift))):
            for low, high, n, fraction in reliability(logits, correct, a, b):
                lines.append(f"| {split} | {name} | [{low:.2f}, {high:.2f}) | {n:,} | {fraction:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Platt-scale a served sigmoid detector's scores on val; write the calibrated version."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("source", type=Path, help="a version folder, e.g. model_repository/detr-digits/3")
    parser.add_argument("--to", type=Path, required=True, help="the new version folder")
    parser.add_argument("--docs", type=Path, help="also write reliability.md and calibration.json here")
    args = parser.parse_args(argv)
    figures = calibrate(args.source, args.to, docs=args.docs)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
