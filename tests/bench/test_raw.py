"""(a), the in-process ceiling: one default session against one-thread sessions side by side.

Runs the committed vit-digits model for a few tenths of a second per point; throughputs are
compared with each other, never with a wall-clock bound.
"""

from __future__ import annotations

from pathlib import Path

from bench import raw

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "model_repository" / "vit-digits" / "1"
IMAGE = REPO / "tests" / "images" / "skimage" / "coffee.png"


def test_ort_best_keeps_the_better_of_one_wide_session_and_sessions_side_by_side() -> None:
    best = raw.ort_best(MODEL, [IMAGE], seconds=0.05, cores=2)
    one, two = best["configurations"]
    assert (one["sessions"], one["intra_op_threads"]) == (1, 0)  # ORT's default threads
    assert (two["sessions"], two["intra_op_threads"]) == (2, 1)
    assert set(one["by_batch_size"]) == set(two["by_batch_size"]) == set(raw.BATCH_SIZES)
    assert all(v > 0 for r in (one, two) for v in r["by_batch_size"].values())
    assert best["images_per_s"] == max(one["images_per_s"], two["images_per_s"])
    assert best["sessions"] == (1 if one["images_per_s"] >= two["images_per_s"] else 2)
    assert best["images_per_s"] == best["by_batch_size"][best["best_batch_size"]]


def test_one_core_measures_the_default_session_only() -> None:
    best = raw.ort_best(MODEL, [IMAGE], seconds=0.02, cores=1)
    assert [r["sessions"] for r in best["configurations"]] == [1]
    assert best["images_per_s"] == best["configurations"][0]["images_per_s"]
