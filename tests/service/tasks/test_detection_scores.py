"""The detectors' score rules (service/tasks/detection_scores.py) on hand-computed cases, and their manifest options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.runtime.manifest import ManifestError, load_manifest
from service.tasks import detection
from service.tasks.detection import DetectOptions, detect
from service.tasks.detection_scores import RULES, SigmoidTopK, SoftmaxNoObject
from tests.conftest import MODEL_REPOSITORY


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


# 3 queries x 2 classes, sigmoid scores chosen so every rank is known by hand.
PROBS = np.array([[0.9, 0.8], [0.3, 0.95], [0.6, 0.1]])
LOGITS = np.vectorize(logit)(PROBS).astype(np.float32)
BOXES = np.array([[0.5, 0.5, 0.2, 0.2], [0.25, 0.25, 0.5, 0.5], [0.9, 0.1, 0.2, 0.2]], np.float32)


def test_sigmoid_top_k_ranks_pairs_over_queries_and_classes() -> None:
    queries, classes, scores = SigmoidTopK().select(LOGITS, threshold=0.0, max_detections=100, top_k=None)
    # top_k None = 3 queries: the three best of the six (query, class) pairs, 0.95 > 0.9 > 0.8
    assert queries.tolist() == [1, 0, 0] and classes.tolist() == [1, 0, 1]
    np.testing.assert_allclose(scores, [0.95, 0.9, 0.8], atol=1e-6)
    queries, classes, scores = SigmoidTopK().select(LOGITS, threshold=0.5, max_detections=100, top_k=100)
    assert list(zip(queries.tolist(), classes.tolist(), strict=True)) == [(1, 1), (0, 0), (0, 1), (2, 0)]
    queries, _, _ = SigmoidTopK().select(LOGITS, threshold=0.5, max_detections=2, top_k=100)
    assert queries.tolist() == [1, 0]


def test_softmax_rule_is_detrs_best_class_without_no_object() -> None:
    logits = np.log(np.array([[0.7, 0.1, 0.2], [0.1, 0.1, 0.8], [0.2, 0.5, 0.3]], np.float32))  # no-object last
    queries, classes, scores = SoftmaxNoObject().select(logits, threshold=0.4, max_detections=100, top_k=None)
    assert queries.tolist() == [0, 2] and classes.tolist() == [0, 1]
    np.testing.assert_allclose(scores, [0.7, 0.5], atol=1e-6)


@pytest.mark.parametrize("rule", [SoftmaxNoObject(), SigmoidTopK()], ids=lambda r: r.name)
def test_the_threshold_compares_the_score_as_reported_not_its_float32(rule) -> None:
    """Scores are reported as float64 widenings of the model's float32; a threshold between one and
    the next float32 must not keep it (a fresh user's find: numpy compared in float32)."""
    logits = LOGITS if rule.name == "sigmoid_top_k" else np.log(np.array([[0.7, 0.1, 0.2]], np.float32))
    _, _, scores = rule.select(logits, threshold=0.0, max_detections=1, top_k=None)
    best = float(scores[0])
    just_above = float(np.nextafter(best, 1.0))  # a Python float, as the query gives: above the score
    assert np.float32(just_above) == np.float32(best)
    assert len(rule.select(logits, threshold=just_above, max_detections=1, top_k=None)[0]) == 0
    assert len(rule.select(logits, threshold=best, max_detections=1, top_k=None)[0]) == 1


def test_detect_with_sigmoid_top_k_gives_one_box_per_pair_in_pixels() -> None:
    detections = detect(
        LOGITS, BOXES, ["cat", "dog"], threshold=0.7, max_detections=10, box_scale=(200.0, 100.0),
        image_size=(200, 100), scores=SigmoidTopK.name, top_k=4,
    )  # fmt: skip
    assert [(d["label"], round(d["score"], 4)) for d in detections] == [("dog", 0.95), ("cat", 0.9), ("dog", 0.8)]
    assert detections[0]["box"] == pytest.approx({"xmin": 0.0, "ymin": 0.0, "xmax": 100.0, "ymax": 50.0})
    assert (
        detections[1]["box"]
        == detections[2]["box"]
        == pytest.approx({"xmin": 80.0, "ymin": 40.0, "xmax": 120.0, "ymax": 60.0})
    )
    with pytest.raises(ValueError, match="unknown score rule"):
        detect(LOGITS, BOXES, ["cat", "dog"], threshold=0.5, max_detections=1, box_scale=(1, 1), image_size=(1, 1),
               scores="nms")  # fmt: skip


def test_options_default_to_detrs_rule_and_refuse_what_they_do_not_know() -> None:
    assert DetectOptions() == DetectOptions(scores="softmax", top_k=None, box_format="cxcywh")
    assert RULES[DetectOptions().scores].no_object
    assert DetectOptions(scores="sigmoid_top_k", top_k=100).top_k == 100
    for bad in ({"scores": "nms"}, {"scores": "softmax", "top_k": 5}, {"box_format": "xyxy"}, {"top_k": 0}):
        with pytest.raises(ValueError):
            DetectOptions.model_validate(bad)


def test_committed_detr_manifest_still_loads_with_softmax(tmp_path) -> None:
    first = MODEL_REPOSITORY / "detr-digits" / "1" / "model.json"  # version 1: written before task_options
    manifest = load_manifest(first)
    assert manifest.task_options is None and detection.TASK.name == manifest.task
    data = json.loads(first.read_text())
    data["task_options"] = {"scores": "sigmoid_top_k", "top_k": 0}
    (tmp_path / "model.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="task_options"):
        load_manifest(tmp_path / "model.json")
