"""What users see in a detector's sets: duplicates, precision and recall (models.detection_eval.set_quality)."""

from __future__ import annotations

import pytest

from models.detection_eval import set_quality
from tests.models.helpers import detection, ground_truth


def test_a_double_a_miss_and_a_wrong_label_are_counted() -> None:
    truth = ground_truth(
        [(3, 10, 10, 20, 20), (5, 50, 50, 20, 20)],  # image 1: a 3 and a 5
        [(1, 0, 0, 10, 10)],  # image 2: a 1
    )
    detections = [
        [
            detection(3, 0.9, 10, 10, 30, 30),  # the 3
            detection(3, 0.8, 11, 11, 31, 31),  # its double (same label, IoU > 0.5)
            detection(5, 0.4, 50, 50, 70, 70),  # the 5, under the threshold: missed
        ],
        [detection(2, 0.7, 0, 0, 10, 10)],  # wrong label on the 1: a false positive and a miss
    ]
    quality = set_quality(truth, detections, threshold=0.5)
    assert quality["duplicate_canvas_fraction"] == 0.5 and quality["duplicate_pairs"] == 1
    assert quality["detections"] == 3 and quality["objects"] == 3
    assert quality["false_positives"] == 2 and quality["missed"] == 2
    assert quality["precision"] == pytest.approx(1 / 3) and quality["recall"] == pytest.approx(1 / 3)
    assert quality["missed_scored_below_threshold"] == 1  # the 5 (0.4) is in place; the 1 has no box of its label
    # at threshold 0.3 the 5 is found
    assert set_quality(truth, detections, threshold=0.3)["recall"] == pytest.approx(2 / 3)


def test_neighbours_of_different_labels_or_low_overlap_are_not_duplicates() -> None:
    truth = ground_truth([(1, 0, 0, 10, 10), (2, 0, 0, 10, 10), (1, 20, 0, 10, 10)])
    detections = [[detection(1, 0.9, 0, 0, 10, 10), detection(2, 0.9, 0, 0, 10, 10), detection(1, 0.9, 20, 0, 30, 10)]]
    quality = set_quality(truth, detections)
    assert quality["duplicate_pairs"] == 0 and quality["precision"] == 1.0 and quality["recall"] == 1.0


def test_an_empty_set_has_precision_one_and_recall_zero() -> None:
    quality = set_quality(ground_truth([(1, 0, 0, 10, 10)]), [[]])
    assert quality["precision"] == 1.0 and quality["recall"] == 0.0 and quality["missed"] == 1
    with pytest.raises(ValueError, match="detection lists"):
        set_quality(ground_truth(), [[]])


def test_sigmoid_post_processing_by_hand() -> None:
    """Deformable DETR / Hugging Face: sigmoid per class, top-k over queries x classes, then the threshold."""
    import math

    import numpy as np

    from models.detection_eval import score_rule, sigmoid_detect

    logits = np.array([[2.0, -3.0], [0.0, 1.0], [-5.0, -5.0]])  # 3 queries, 2 classes, no "no object"
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.25, 0.25, 0.5, 0.5], [0.9, 0.9, 0.1, 0.1]])
    kept = sigmoid_detect(
        logits, boxes, ["a", "b"], threshold=0.4, max_detections=3, box_scale=(100.0, 50.0), image_size=(80, 40)
    )
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # Pairs by score: (q0, a) 0.881, (q1, b) 0.731, (q1, a) 0.5, then below 0.4 or past the top 3.
    assert [(d["label"], round(d["score"], 4)) for d in kept] == [
        ("a", round(sig(2.0), 4)),
        ("b", round(sig(1.0), 4)),
        ("a", 0.5),
    ]
    assert kept[0]["box"] == {"xmin": 40.0, "ymin": 15.0, "xmax": 60.0, "ymax": 35.0}
    assert kept[1]["box"] == {"xmin": 0.0, "ymin": 0.0, "xmax": 50.0, "ymax": 25.0}
    assert kept[2]["box"] == kept[1]["box"]  # one query may give two labels
    top1 = sigmoid_detect(
        logits, boxes, ["a", "b"], threshold=0.0, max_detections=1, box_scale=(1.0, 1.0), image_size=(1, 1)
    )
    assert [d["class_id"] for d in top1] == [0]
    assert score_rule("sigmoid") is sigmoid_detect and score_rule("sigmoid_top_k") is sigmoid_detect
    with pytest.raises(ValueError, match="softmax, sigmoid"):
        score_rule("argmax")


def test_coco_ap_keeps_each_image_to_its_own_objects() -> None:
    """Two images with an object each in different places: each image's box finds its own object only."""
    from models.detection_eval import coco_ap

    truth = ground_truth([(1, 0, 0, 40, 40)], [(1, 50, 50, 40, 40)])
    truth["categories"] = [{"id": 1, "name": "one"}]
    right = [[detection(1, 0.9, 0, 0, 40, 40)], [detection(1, 0.9, 50, 50, 90, 90)]]
    assert coco_ap(truth, right)["AP"] == pytest.approx(1.0)
    swapped = [[detection(1, 0.9, 50, 50, 90, 90)], [detection(1, 0.9, 0, 0, 40, 40)]]  # each on the other's object
    assert coco_ap(truth, swapped)["AP"] == pytest.approx(0.0)
