"""Platt scaling of a sigmoid detector's scores (models.calibrate_detector), and the committed
detr-digits version 4 that it made from version 3 (issue 21)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.calibrate_detector import (
    calibrated_graph,
    candidates,
    fit_platt,
    negative_log_likelihood,
    reliability,
)
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY, ROOT
from tests.models.helpers import detection, ground_truth


def test_the_fit_recovers_the_scale_and_shift_that_drew_the_labels() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 40_000)
    correct = rng.random(40_000) < 1 / (1 + np.exp(-(2.5 * logits + 0.6)))
    scale, shift = fit_platt(logits, correct)
    assert scale == pytest.approx(2.5, abs=0.15) and shift == pytest.approx(0.6, abs=0.1)
    # The fit is the likelihood's optimum: better than the raw scores and than the truth's neighbours.
    best = negative_log_likelihood(logits, correct, scale, shift)
    assert best < negative_log_likelihood(logits, correct) and best <= negative_log_likelihood(
        logits, correct, 2.5, 0.6
    )


def test_the_fit_refuses_one_class_and_a_reversed_order() -> None:
    with pytest.raises(ValueError, match="both correct and wrong"):
        fit_platt(np.array([1.0, 2.0]), np.array([1, 1]))
    with pytest.raises(ValueError, match="not positive"):
        fit_platt(np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0]), np.array([1, 1, 1, 0, 0, 0]))


def test_candidates_are_labelled_by_greedy_matching_so_a_double_is_wrong() -> None:
    truth = ground_truth([(3, 10, 10, 20, 20), (5, 50, 50, 20, 20)])
    detections = [
        [
            detection(3, 0.8, 11, 11, 31, 31),  # the 3's double, listed first but scoring lower
            detection(3, 0.9, 10, 10, 30, 30),  # the 3
            detection(5, 0.2, 50, 50, 70, 70),  # the 5, scored low: still correct
            detection(7, 0.6, 50, 50, 70, 70),  # a wrong label
        ]
    ]
    logits, correct = candidates(truth, detections)
    # Best score first: 0.9 (the 3), 0.8 (its double), 0.6 (the 7), 0.2 (the 5).
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), [0.9, 0.8, 0.6, 0.2])
    assert correct.tolist() == [1, 0, 0, 1]


def test_reliability_bins_count_and_score_every_candidate() -> None:
    logits = np.log(np.array([0.01, 0.02, 0.55, 0.58, 0.97]) / (1 - np.array([0.01, 0.02, 0.55, 0.58, 0.97])))
    rows = reliability(logits, np.array([0, 0, 1, 0, 1]))
    assert rows == [(0.0, 0.05, 2, 0.0), (0.5, 0.6, 2, 0.5), (0.95, 1.0, 1, 1.0)]


def test_the_calibrated_graph_outputs_scale_times_logits_plus_shift_under_the_same_names(tmp_path) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Neg", ["pixel_values"], ["pred_logits"]),
            helper.make_node("Identity", ["pixel_values"], ["pred_boxes"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 4])],
        [
            helper.make_tensor_value_info("pred_logits", TensorProto.FLOAT, ["batch", 3, 4]),
            helper.make_tensor_value_info("pred_boxes", TensorProto.FLOAT, ["batch", 3, 4]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10
    )  # as the exporter writes
    onnx.save(model, tmp_path / "raw.onnx")
    calibrated_graph(tmp_path / "raw.onnx", tmp_path / "calibrated.onnx", 2.5, 0.75)
    session = ort.InferenceSession(str(tmp_path / "calibrated.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["pred_logits", "pred_boxes"]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    logits, boxes = session.run(None, {"pixel_values": x})
    np.testing.assert_allclose(logits, 2.5 * -x + 0.75, rtol=1e-6)
    np.testing.assert_array_equal(boxes, x)
    with pytest.raises(ValueError, match="no output 'scores'"):
        calibrated_graph(tmp_path / "raw.onnx", tmp_path / "other.onnx", 1.0, 0.0, output="scores")


@pytest.mark.slow
def test_committed_version_4_is_what_the_command_makes_from_version_3(tmp_path) -> None:
    """detr-digits version 4 = version 3's graph + Platt scaling fit on the val split (issue 21): the
    Makefile's command, rerun into a temporary folder, gives the committed manifest and graph."""
    from export.detr import onnx_runner
    from models.calibrate_detector import calibrate

    source, committed = MODEL_REPOSITORY / "detr-digits" / "3", MODEL_REPOSITORY / "detr-digits" / "4"
    figures = calibrate(source, tmp_path / "4", docs=tmp_path / "docs")
    manifest, recorded = load_manifest(committed / "model.json"), load_manifest(tmp_path / "4" / "model.json")
    metrics = manifest.provenance.metrics
    for key, value in recorded.provenance.metrics.items():
        if key != "calibration_seconds":
            # rel 1e-5, not 1e-6: version 3's scores differ in their last float32 bits from one CPU to another, and
            # the fit carries that on (the VM of 2026-12-07 21:15 UTC: calibration_shift 1.4e-6 relative apart)
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
    assert manifest.provenance.recipe.startswith(load_manifest(source / "model.json").provenance.recipe + "; then ")
    assert "models.calibrate_detector" in manifest.provenance.recipe
    assert (
        json.loads((tmp_path / "docs" / "calibration.json").read_text())["calibration_scale"]
        == figures["calibration_scale"]
    )
    # metrics.json: this version's own figures at the threshold and on val, not the source's (a fresh user's
    # find); its PyTorch AP is the training record's, as the manifest's test_AP_pytorch.
    written = json.loads((committed / "metrics.json").read_text())
    for key in ("test_duplicate_canvas_fraction", "test_precision", "test_recall", "calibration_scale"):
        assert written[key] == pytest.approx(metrics[key], rel=1e-9), key
    assert written["test_AP"] == metrics["test_AP_pytorch"]
    assert written["val_recall"] == pytest.approx(figures["val_recall"])
    committed_table = (ROOT / "docs" / "detr-digits-experiments" / "calibrated" / "reliability.md").read_text()
    assert (tmp_path / "docs" / "reliability.md").read_text().split("\n\n")[1] == committed_table.split("\n\n")[1]
    # Calibrated: the fit lowers the likelihood's loss on val, where it was fit, and on test, where it was not.
    assert metrics["calibration_val_nll"] < metrics["calibration_val_nll_raw"]
    assert metrics["calibration_test_nll"] < metrics["calibration_test_nll_raw"]
    # A calibrated 0.5 is a raw score of calibration_raw_threshold.
    scale, shift, threshold = (metrics[f"calibration_{k}"] for k in ("scale", "shift", "raw_threshold"))
    assert scale * np.log(threshold / (1 - threshold)) + shift == pytest.approx(0.0, abs=1e-9)
    # The graph: version 3's logits times scale plus shift, its boxes unchanged (8 val canvases, largest bucket).
    from PIL import Image

    from models.detection_data import load_split
    from service.batching.arrays import pad_inputs
    from service.imaging.preprocess import Preprocessor

    preprocessing = load_manifest(source / "model.json").preprocessing
    preprocess = Preprocessor(preprocessing)
    inputs = [preprocess(Image.fromarray(c.image).convert("L")) for c in load_split("val", None, 8)]
    bucket = max(preprocessing.buckets or [], key=lambda b: b.height * b.width)
    x, mask = pad_inputs(
        inputs,
        np.empty((8, 1, bucket.height, bucket.width), np.float32),
        np.empty((8, bucket.height, bucket.width), np.int64),
    )
    raw_logits, raw_boxes = onnx_runner(source / "model.onnx")(x, mask)
    new_logits, new_boxes = onnx_runner(committed / "model.onnx")(x, mask)
    np.testing.assert_allclose(new_logits, scale * raw_logits + shift, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(new_boxes, raw_boxes)
