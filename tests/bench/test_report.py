"""The benchmark's arithmetic: ratios to (a) and (b), the issue's targets, the README table (no load is run)."""

from __future__ import annotations

import pytest

from bench import report

SERVERS = {
    "patchserve": "(c) patchserve",
    "patchserve-no-batching": "(d) patchserve, max_batch_size 1",
    "naive": "(e) naive FastAPI endpoint",
    "litserve": "(f) LitServe, batching on",
}


def point(server: str, size: str, concurrency: int, throughput: float, p50: float, p99: float) -> dict:
    return {
        "server": server, "label": SERVERS[server], "size": size, "concurrency": concurrency,
        "throughput": throughput, "p50_ms": p50, "p90_ms": p50, "p99_ms": p99, "errors": 0,
    }  # fmt: skip


def results() -> dict:
    raw = {
        size: {
            "a": {"images_per_s": 60.0, "best_batch_size": 4},
            "b_sequential": {"images_per_s": 40.0, "decode_ms": 1.5},
            "b_threads": {"images_per_s": 50.0},
        }
        for size in ("640x480", "4000x3000")
    }
    http = [
        point("patchserve", "640x480", 1, 45.0, 20.0, 24.0),
        point("naive", "640x480", 1, 40.0, 25.0, 30.0),
        point("patchserve", "640x480", 16, 55.0, 280.0, 350.0),
        point("naive", "640x480", 16, 50.0, 300.0, 500.0),
        point("litserve", "640x480", 16, 40.0, 390.0, 580.0),
        point("patchserve", "4000x3000", 1, 30.0, 33.0, 40.0),
        point("naive", "4000x3000", 1, 28.0, 36.0, 45.0),
        point("patchserve", "4000x3000", 16, 33.0, 480.0, 520.0),
        point("naive", "4000x3000", 16, 22.0, 700.0, 900.0),
        point("litserve", "4000x3000", 16, 27.5, 600.0, 700.0),
    ]
    data = {
        "started": "2026-01-01T00:00:00+00:00",
        "command": "make bench",
        "machine": {
            "cpu": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "load_average": [0.3, 0.4, 0.5],
            "versions": {"onnxruntime": "1.31.1", "litserve": "0.2.19"}, "wrk": "wrk 4.1.0",
        },
        "model": {"name": "vit-ti16-random", "manifest": "ViT-Ti/16"},
        "protocol": {"seconds": 15, "warmup": 3},
        "servers": {key: {"label": label} for key, label in SERVERS.items()},
        "raw": raw,
        "http": http,
    }  # fmt: skip
    data["ratios"] = report.ratios(data)
    data["targets"] = report.targets(data)
    return data


def test_every_figure_is_divided_by_a_and_b_of_its_own_size() -> None:
    ratio = next(r for r in results()["ratios"] if r["server"] == "patchserve" and r["concurrency"] == 16)
    assert ratio["vs_a"] == pytest.approx(55 / 60)
    assert ratio["vs_b_sequential"] == pytest.approx(55 / 40)
    assert ratio["vs_b_threads"] == pytest.approx(55 / 50)


def test_the_targets_are_the_issues_with_the_measured_values() -> None:
    targets = {t["target"]: t for t in results()["targets"]}
    assert targets["640x480, c=16: patchserve / (a) raw ORT best batch"]["value"] == pytest.approx(55 / 60)
    assert targets["640x480, c=16: patchserve / (a) raw ORT best batch"]["met"] is True  # 0.917 >= 0.90
    assert targets["640x480, c=16: patchserve / (f) LitServe"]["value"] == pytest.approx(55 / 40)
    assert targets["640x480, c=16: patchserve / (e) naive"]["value"] == pytest.approx(1.1)
    assert targets["640x480, c=16: patchserve p99 / its own p50"]["value"] == pytest.approx(350 / 280)
    assert targets["4000x3000, c=16: patchserve / the better of (e), (f)"]["value"] == pytest.approx(33 / 27.5)
    assert targets["640x480, c=1: patchserve p50 / (e) naive p50"]["met"] is True  # 20 <= 25 ms
    assert targets["4000x3000, c=1: patchserve p50 / (e) naive p50"]["value"] == pytest.approx(33 / 36)


def test_a_target_whose_points_were_not_measured_says_so() -> None:
    data = results()
    data["http"] = [r for r in data["http"] if r["server"] != "litserve"]
    targets = {t["target"]: t for t in report.targets(data)}
    assert targets["640x480, c=16: patchserve / (f) LitServe"] == {
        "target": "640x480, c=16: patchserve / (f) LitServe", "value": None, "bound": 1.25, "at_least": True,
        "met": None,
    }  # fmt: skip
    assert targets["4000x3000, c=16: patchserve / the better of (e), (f)"]["value"] == pytest.approx(33 / 22)


def test_the_markdown_table_has_a_row_per_point_and_the_machine() -> None:
    text = report.markdown(results(), "bench/results/x.json")
    assert "AMD EPYC, 2 cores" in text and "0.30, 0.40, 0.50" in text
    assert "| (c) patchserve | 640x480 | 16 | 55.0 | 280.0 | 280.0 | 350.0 | 0 | 0.92 | 1.38 |" in text
    assert text.count("| (e) naive FastAPI endpoint |") == 4
