"""bench/detr_buckets.py's pure parts: the aspect-ratio stream, the shapes it makes, the /metrics deltas, the table.

No server is started and nothing is exported.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.detr_buckets import ASPECTS, aspect_size, distinct_shapes, shapes, stream, summary, table
from bench.scrape import batch_stats, histogram
from service.imaging.spec import Preprocessing


def test_each_aspect_ratio_has_a_long_side_of_640_pixels() -> None:
    sizes = {name: aspect_size(ratio) for name, ratio in ASPECTS.items()}
    assert sizes == {"4:3": (640, 480), "3:4": (480, 640), "1:1": (640, 640), "16:9": (640, 360), "5:4": (640, 512)}
    assert aspect_size((3, 2), long_side=300) == (300, 200)


def test_the_stream_posts_every_photo_at_every_aspect_equally_often_in_a_seeded_order() -> None:
    aspects = list(ASPECTS)
    requests = stream(50, photos=5, aspects=aspects, seed=0)
    assert len(requests) == 50
    assert sorted(requests[:25]) == sorted((p, a) for p in range(5) for a in aspects)  # one block: each pair once
    assert Counter(a for _, a in requests) == {a: 10 for a in aspects}
    assert Counter(p for p, _ in requests) == {p: 10 for p in range(5)}
    assert stream(50, 5, aspects, seed=0) == requests  # the same stream every round and every run
    assert stream(50, 5, aspects, seed=1) != requests
    assert requests[:25] != sorted(requests[:25])  # shuffled, not grouped by shape
    assert stream(7, 5, aspects) == requests[:7]


def detr_800() -> Preprocessing:
    """DETR-R50's preprocessing as imported: shortest_edge 800, longest_edge 1333, export.hf.default_buckets."""
    buckets = [(800, 800), (800, 1066), (1066, 800), (800, 1333), (1333, 800)]
    return Preprocessing(
        color_mode="RGB",
        resize="shortest_edge",
        shortest_edge=800,
        longest_edge=1333,
        mean=[0.485, 0.456, 0.406],
        std=[0.229, 0.224, 0.225],
        buckets=[{"height": h, "width": w} for h, w in buckets],
    )


def test_five_aspect_ratios_make_five_exact_shapes_and_four_buckets_at_800() -> None:
    geometry = shapes(detr_800(), list(ASPECTS))
    assert {a: (tuple(g["input"]), g["bucket"]) for a, g in geometry.items()} == {
        "4:3": ((800, 1066), (800, 1066)),
        "3:4": ((1066, 800), (1066, 800)),
        "1:1": ((800, 800), (800, 800)),
        "16:9": ((750, 1333), (800, 1333)),  # the long side capped at 1333, padded 50 rows
        "5:4": ((800, 1000), (800, 1066)),  # shares the 4:3 photos' bucket (and so their batches)
    }
    assert geometry["16:9"]["size"] == [640, 360]
    assert distinct_shapes(geometry, "exact") == 5
    assert distinct_shapes(geometry, "buckets") == 4


def exposition(model: str, batches: list[int], padding: list[float], other: list[int]) -> str:
    """A /metrics text with the server's two histograms, as prometheus_client writes them."""
    registry = CollectorRegistry()
    sizes = Histogram(
        "patchserve_batch_size", "Images per model run.", ["model", "version"],
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry,
    )  # fmt: skip
    pads = Histogram(
        "patchserve_padding_fraction", "Padded share.", ["model", "version"], buckets=(0.0, 0.1, 1.0), registry=registry
    )
    for size in batches:
        sizes.labels(model, "1").observe(size)
    for size in other:
        sizes.labels("another", "1").observe(size)
    for share in padding:
        pads.labels(model, "1").observe(share)
    return generate_latest(registry).decode()


def test_a_rounds_batches_are_the_difference_of_two_scrapes_of_its_model_only() -> None:
    before = exposition("detr", [1, 2], [0.0], other=[8])
    after = exposition("detr", [1, 2, 1, 3, 4, 4], [0.0, 0.0625, 0.0], other=[8, 8, 8])
    delta = {
        name: histogram(after, name, "detr").minus(histogram(before, name, "detr"))
        for name in ("patchserve_batch_size", "patchserve_padding_fraction")
    }
    assert delta["patchserve_batch_size"].buckets[1.0] == 1
    assert delta["patchserve_batch_size"].buckets[4.0] == 4
    stats = batch_stats(delta["patchserve_batch_size"], delta["patchserve_padding_fraction"])
    assert stats == {
        "batches": 4,
        "images": 12,
        "singles": 1,
        "mean_batch": 3.0,
        "share_over_1": 0.75,
        "padding": pytest.approx(0.03125),
    }


def test_a_model_without_padding_or_batches_reports_none_rather_than_zero() -> None:
    text = exposition("detr", [], [], other=[2])
    stats = batch_stats(histogram(text, "patchserve_batch_size", "detr"), histogram(text, "x", "detr"))
    assert stats["batches"] == 0
    assert stats["mean_batch"] is None and stats["share_over_1"] is None and stats["padding"] is None


def round_(ips: float, p50: float, p99: float, batches: int, images: int, singles: int, padding: float | None,
           loaded: str = "") -> dict[str, Any]:  # fmt: skip
    share = (batches - singles) / batches
    stats = {"batches": batches, "images": images, "singles": singles, "mean_batch": images / batches,
             "share_over_1": share, "padding": padding}  # fmt: skip
    return {"images_per_second": ips, "p50_ms": p50, "p99_ms": p99, "batches": stats, "loaded": loaded}


def test_the_summary_takes_medians_over_rounds_and_sums_the_batches() -> None:
    rounds = [round_(0.5, 4000, 9000, 8, 20, 2, 0.02), round_(0.7, 3000, 8000, 10, 20, 6, 0.04),
              round_(0.6, 3500, 8500, 12, 20, 10, 0.03)]  # fmt: skip
    s = summary(rounds)
    assert s["images_per_second"] == {"median": 0.6, "min": 0.5, "max": 0.7}
    assert s["p50_ms"]["median"] == 3500 and s["p99_ms"] == {"median": 8500, "min": 8000, "max": 9000}
    assert s["batches"] == 30
    assert s["mean_batch"] == pytest.approx(2.0)
    assert s["share_over_1"] == pytest.approx(12 / 30)
    assert s["padding"] == pytest.approx(0.03)
    assert s["loaded_rounds"] == []


def test_the_table_marks_loaded_rounds_and_gives_no_padding_without_buckets() -> None:
    buckets = [round_(0.62, 6100, 9800, 8, 20, 2, 0.024), round_(0.58, 6300, 10100, 9, 20, 3, 0.024)]
    exact = [round_(0.60, 6000, 9900, 12, 20, 6, None, loaded="foreign processes took 0.90 cores"),
             round_(0.61, 6050, 9700, 12, 20, 6, None)]  # fmt: skip
    results = {
        "configs": {
            "buckets": {"shapes": 4, "ready_seconds": 260.4, "warm_up_seconds": 251.0, "rounds": buckets,
                        "summary": summary(buckets)},
            "exact": {"shapes": 5, "ready_seconds": 41.0, "warm_up_seconds": None, "rounds": exact,
                      "summary": summary(exact)},
        }
    }  # fmt: skip
    lines = table(results).splitlines()
    assert lines[0].startswith("| batching | img/s | p50 ms | p99 ms | mean batch | batches > 1 | padding |")
    assert lines[2] == (
        "| buckets (4 shapes) | 0.60 (0.58–0.62) | 6200 (6100–6300) | 9950 (9800–10100) | 2.35 | 71 % | 2 % "
        "| 260 (251) | quiet |"
    )
    assert lines[3] == (
        "| exact (5 shapes) | 0.60 (0.60–0.61) | 6025 (6000–6050) | 9800 (9700–9900) | 1.67 | 50 % | – "
        "| 41 (?) | LOADED (1 of 2 rounds) |"
    )
