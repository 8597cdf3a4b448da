"""Classification post-processing (service/tasks/classification.py) on hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.tasks.classification import classify


def test_classify_sorts_and_labels() -> None:
    logits = np.log(np.array([0.1, 0.6, 0.3], dtype=np.float32))
    result = classify(logits, ["cat", "dog", "fox"], top_k=2)
    assert [r["label"] for r in result] == ["dog", "fox"]
    assert [r["class_id"] for r in result] == [1, 2]
    assert result[0]["score"] == pytest.approx(0.6, rel=1e-6) and result[1]["score"] == pytest.approx(0.3, rel=1e-6)


def test_top_k_above_the_label_count_is_clamped() -> None:
    result = classify(np.zeros(3, dtype=np.float32), ["a", "b", "c"], top_k=50)
    assert [r["class_id"] for r in result] == [0, 1, 2]  # ties keep the lower id first
    assert sum(r["score"] for r in result) == pytest.approx(1.0)


def test_wrong_logits_shape_is_an_internal_error() -> None:
    with pytest.raises(ValueError, match=r"\(3,\)"):
        classify(np.zeros(4, dtype=np.float32), ["a", "b", "c"], top_k=1)


def reference(logits: np.ndarray, top_k: int) -> tuple[list[int], np.ndarray]:
    """Class ids best first (ties: lower id first) and float64 softmax scores, written out independently."""
    exp = np.exp(logits.astype(np.float64) - logits.max())
    scores = exp / exp.sum()
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_k]
    return order, scores[order]


@pytest.mark.parametrize("classes", [2, 10, 64, 65, 1000])  # both sides of the plain-Python path's bound (64)
def test_every_class_count_matches_the_reference(classes: int) -> None:
    rng = np.random.default_rng(classes)
    labels = [f"c{i}" for i in range(classes)]
    for scale in (0.1, 3.0, 40.0):
        logits = (rng.standard_normal(classes) * scale).astype(np.float32)
        logits[classes // 2] = logits[0]  # a tie: the lower id first
        for top_k in (1, 5, classes):
            result = classify(logits, labels, top_k)
            order, scores = reference(logits, top_k)
            assert [r["class_id"] for r in result] == order
            assert [r["label"] for r in result] == [labels[i] for i in order]
            assert [r["score"] for r in result] == pytest.approx(scores.tolist(), rel=1e-12, abs=1e-15)  # float64
            assert all(type(r["class_id"]) is int and type(r["score"]) is float for r in result)  # JSON-ready


@pytest.mark.parametrize("top_k", [1, 3, 5, 8, 999])
def test_ties_across_the_kth_place_keep_the_lower_ids_as_the_full_sort_does(top_k: int) -> None:
    # the partial sort for many classes: scores equal at and around the k-th place, and everything equal
    logits = np.zeros(1000, dtype=np.float32)
    logits[[900, 40, 7, 512, 3, 999, 64]] = 2.0  # seven tied for first, spread over the ids
    logits[[100, 800]] = 3.0
    for case in (logits, np.zeros(1000, dtype=np.float32), np.full(1000, -5.0, dtype=np.float32)):
        result = classify(case, [str(i) for i in range(1000)], top_k)
        order, scores = reference(case, top_k)
        assert [r["class_id"] for r in result] == order
        assert [r["score"] for r in result] == pytest.approx(scores.tolist(), rel=1e-12)


def test_top_k_zero_is_an_empty_list_for_any_class_count() -> None:
    # the route asks for top_k >= 1; the function itself answered [] for 0 before the partial sort, and still does
    for classes in (3, 1000):
        assert classify(np.zeros(classes, dtype=np.float32), [str(i) for i in range(classes)], top_k=0) == []


def test_a_large_logit_gap_gives_one_and_zeros() -> None:
    for classes in (3, 100):
        logits = np.zeros(classes, dtype=np.float32)
        logits[1] = 1e30
        result = classify(logits, [str(i) for i in range(classes)], top_k=2)
        assert [(r["class_id"], r["score"]) for r in result] == [(1, 1.0), (0, 0.0)]


@pytest.mark.parametrize("logits", [[1.0, 2.0, math.nan], [math.inf, 1.0, 2.0], [-math.inf] * 3])
def test_logits_that_are_not_finite_are_answered_as_numpy_answers_them(logits: list[float], monkeypatch) -> None:
    # a reviewer's: heapq ordered NaN scores by chance; a few classes fall back to numpy's path for them
    from service.tasks import classification

    labels = ["a", "b", "c"]
    with np.errstate(invalid="ignore"):
        few = classify(np.array(logits, dtype=np.float32), labels, 3)
        monkeypatch.setattr(classification, "SMALL", 0)
        numpy_path = classify(np.array(logits, dtype=np.float32), labels, 3)
    assert [r["class_id"] for r in few] == [r["class_id"] for r in numpy_path] == [0, 1, 2]
    assert all(math.isnan(r["score"]) for r in few)  # (rendered as null: a model that gave them is broken)
