"""Classification post-processing (service/tasks/classification.py) on hand-computed values."""

from __future__ import annotations

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
