"""The benchmark's arithmetic: medians over rounds, the ceiling, ratios, the issue's targets, void points, the
interleaving order, the tables (no load is run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from bench.run import rotated, schedule

SERVERS = {
    "patchserve": "(c) patchserve",
    "patchserve-no-batching": "(d) patchserve, max_batch_size 1",
    "naive": "(e) naive FastAPI endpoint",
    "litserve": "(f) LitServe, batching on",
}
QUIET = {"foreign_cores": 0.01}


def round_(throughput: float, p50: float, p99: float, void: str = "") -> dict:
    load = {"foreign_cores": 0.5} if void else QUIET
    return {"throughput": throughput, "p50_ms": p50, "p90_ms": p50, "p99_ms": p99, "errors": 0, "void": void,
            "load": load}  # fmt: skip


def point(server: str, size: str, c: int, throughput: float, p50: float, p99: float, void: str = "") -> dict:
    rounds = [round_(throughput * f, p50 * f, p99 * f) for f in (0.95, 1.0, 1.05)]
    if void:
        rounds[1] = round_(throughput, p50, p99, void)
    return {"model": "m", "server": server, "label": SERVERS[server], "size": size, "concurrency": c,
            **report.summarise(rounds), "rounds_detail": rounds}  # fmt: skip


def results(void: set[tuple[str, str, int]] = frozenset()) -> dict:
    raw = {
        size: {"a": {"images_per_s": 94.2, "best_batch_size": 4}, "b_sequential": {"images_per_s": 73.0},
               "b_threads": {"images_per_s": 74.0}, "void": ""}
        for size in ("640x480", "4000x3000")
    }  # fmt: skip
    ceiling = {
        size: {"images_per_s": report.ceiling(94.2, decode / 1e3, 0.7e-3, 2), "decode_cpu_ms": decode,
               "http_cpu_ms": 0.7, "cores": 2, "void": False}
        for size, decode in (("640x480", 1.3), ("4000x3000", 13.1))
    }  # fmt: skip
    figures = [
        ("patchserve", "640x480", 1, 70.0, 14.0, 16.0), ("naive", "640x480", 1, 68.5, 14.6, 17.0),
        ("litserve", "640x480", 1, 47.3, 21.1, 25.0),
        ("patchserve", "640x480", 16, 82.0, 190.0, 230.0), ("naive", "640x480", 16, 73.0, 210.0, 329.0),
        ("litserve", "640x480", 16, 60.0, 260.0, 357.0),
        ("patchserve", "640x480", 64, 83.0, 760.0, 900.0), ("naive", "640x480", 64, 74.0, 850.0, 1300.0),
        ("litserve", "640x480", 64, 61.0, 1000.0, 1500.0),
        ("patchserve", "4000x3000", 1, 40.0, 25.0, 30.0), ("naive", "4000x3000", 1, 39.6, 25.3, 31.0),
        ("patchserve", "4000x3000", 16, 54.0, 290.0, 330.0), ("naive", "4000x3000", 16, 50.5, 310.0, 420.0),
        ("litserve", "4000x3000", 16, 39.9, 400.0, 520.0),
    ]  # fmt: skip
    http = [point(*f, void="foreign processes took 0.50 cores" if f[:3] in void else "") for f in figures]
    data = {
        "started": "2026-12-01T20:00:00+00:00", "finished": "2026-12-01T20:35:00+00:00", "command": "make bench",
        "machine": {"cpu": "AMD EPYC", "cores": 2, "cpus": "2 usable cores", "memory_gib": 23.5,
                    "versions": {"onnxruntime": "1.31.1", "litserve": "0.2.19"}, "wrk": "wrk 4.1.0"},
        "model": {"name": "vit-ti16-random", "manifest": "ViT-Ti/16"},
        "protocol": {"seconds": 10, "warmup": 2, "rounds": 3, "void_threshold_cores": 0.1},
        "servers": {key: {"label": label} for key, label in SERVERS.items()},
        "raw": raw, "ceiling": ceiling, "http": http,
        "trained": [{"model": "vit-digits", "size": "640x480", "raw": raw["640x480"], "http": [
            point("patchserve", "640x480", 1, 600.0, 1.3, 2.0), point("naive", "640x480", 1, 620.0, 1.4, 7.0),
            point("patchserve", "640x480", 16, 700.0, 21.0, 60.0), point("naive", "640x480", 16, 530.0, 29.0, 75.0),
        ]}],
        "autotune": {"vit-ti16-random (patchserve)": {
            "threads": {"reason": "2 usable cores: 1 instance × 2 intra-op threads"},
            "autotune": {"source": "measured", "chosen": {"instances": 1, "max_batch_size": 4},
                         "curve": [{"instances": 1, "batch_size": 1, "images_per_s": 82.0},
                                   {"instances": 1, "batch_size": 4, "images_per_s": 94.0}]}}},
    }  # fmt: skip
    data["ratios"] = report.ratios(data)
    data["targets"] = report.targets(data)
    return data


def test_the_ceiling_adds_decode_and_http_cpu_to_ort_over_the_cores() -> None:
    # 1 / (1/94.2 + (1.3 + 0.7) ms / 2 cores): 10.616 ms + 1.0 ms per image
    assert report.ceiling(94.2, 1.3e-3, 0.7e-3, 2) == pytest.approx(1 / (1 / 94.2 + 0.001))
    assert report.ceiling(94.2, 1.3e-3, 0.7e-3, 2) == pytest.approx(86.09, abs=0.01)
    assert report.ceiling(94.2, 13.1e-3, 0.7e-3, 2) == pytest.approx(57.09, abs=0.01)
    assert report.ceiling(100.0, 0.0, 0.0, 4) == pytest.approx(100.0)  # nothing else to do: ORT's own rate


def test_rounds_give_the_median_and_its_spread_and_one_void_round_voids_the_point() -> None:
    summary = report.summarise([round_(90, 10, 12), round_(110, 12, 15), round_(100, 11, 13)])
    assert (summary["throughput"], summary["throughput_min"], summary["throughput_max"]) == (100, 90, 110)
    assert summary["p99_ms"] == 13 and not summary["void"] and summary["rounds_valid"] == 3
    loaded = report.summarise([round_(90, 10, 12), round_(50, 20, 30, "foreign processes took 0.5 cores")])
    assert (
        loaded["void"]
        and loaded["rounds_valid"] == 1
        and loaded["void_reasons"] == ["foreign processes took 0.5 cores"]
    )
    assert loaded["foreign_cores_max"] == 0.5
    nothing = report.summarise([round_(50, 20, 30, "loaded")])
    assert nothing["void"] and nothing["throughput"] is None


def test_contestants_are_interleaved_in_rounds_within_each_point() -> None:
    order = schedule(["640x480", "4000x3000"], [1, 16], ["A", "B", "C"], rounds=3)
    first = [(r, key) for size, c, r, key in order if (size, c) == ("640x480", 1)]
    assert first == [(0, "A"), (0, "B"), (0, "C"), (1, "B"), (1, "C"), (1, "A"), (2, "C"), (2, "A"), (2, "B")]
    points = [(size, c) for size, c, _, _ in order[::9]]
    assert points == [("640x480", 1), ("640x480", 16), ("4000x3000", 1), ("4000x3000", 16)]
    assert len(order) == 2 * 2 * 3 * 3


def test_every_contestant_takes_every_place_once_over_as_many_rounds() -> None:
    keys = ["A", "B", "C", "D"]
    places = [rotated(keys, r) for r in range(4)]
    for place in range(4):
        assert sorted(order[place] for order in places) == keys  # a cyclic Latin square
    assert all(sorted(order) == keys for order in places)
    assert rotated(keys, 5) == rotated(keys, 1)  # more rounds than contestants: the turn goes on
    assert rotated([], 2) == []


def test_the_targets_are_issue_14s_with_the_medians() -> None:
    targets = {t["target"]: t for t in results()["targets"]}
    assert targets["640x480, c=16: patchserve / naive"]["value"] == pytest.approx(82 / 73)
    assert targets["640x480, c=16: patchserve / naive"]["met"] is True  # 1.12 >= 1.05
    assert targets["640x480, c=16: patchserve / litserve"]["value"] == pytest.approx(82 / 60)
    assert targets["640x480, c=16: patchserve / ceiling"]["value"] == pytest.approx(82 / 86.0868, rel=1e-4)
    assert targets["640x480, c=64: patchserve / naive"]["value"] == pytest.approx(83 / 74)
    assert targets["640x480, c=1: patchserve p50 / naive p50"]["met"] is True  # 14.0 <= 14.6
    assert targets["640x480, c=16: patchserve p99 / its p50"]["value"] == pytest.approx(230 / 190)
    assert targets["4000x3000, c=16: patchserve / litserve"]["met"] is True  # 54 / 39.9 = 1.35
    assert targets["4000x3000, c=64: patchserve / naive"]["met"] is None  # not measured
    assert targets["vit-digits, c=16: patchserve / naive"]["value"] == pytest.approx(700 / 530)
    assert targets["vit-digits, c=1: patchserve p50 / naive p50"]["met"] is True


def test_a_target_resting_on_a_void_point_is_void_not_met_or_missed() -> None:
    data = results(void={("naive", "640x480", 16)})
    targets = {t["target"]: t for t in data["targets"]}
    assert targets["640x480, c=16: patchserve / naive"]["value"] is None
    assert targets["640x480, c=16: patchserve / naive"]["met"] is None
    assert targets["640x480, c=16: patchserve / litserve"]["met"] is True  # its own points were quiet
    ratio = {(r["server"], r["size"], r["concurrency"]): r for r in data["ratios"]}
    naive = ratio[("naive", "640x480", 16)]
    assert naive["vs_ceiling"] is None


def test_the_tables_show_medians_with_their_spread_and_never_a_void_points_number() -> None:
    text = report.markdown(results(void={("naive", "640x480", 16)}), "bench/results/x.json")
    assert "AMD EPYC, 2 usable cores" in text and "3 interleaved rounds" in text
    assert "Quiet: 17 of 18 points valid" in text
    assert "the order turned" not in text  # a file from before the turning order says nothing of it
    turned = results(void={("naive", "640x480", 16)})
    turned["protocol"]["order"] = "turned"
    assert "3 interleaved rounds, the order turned by one place each round, 10 s" in report.markdown(turned, "x")
    ours = "| (c) patchserve | 640x480 | 16 | 82.0 (77.9–86.1) | 190.0 (180.5–199.5) | 230.0 (218.5–241.5) | 0 | 0.95 |"
    assert ours in text
    naive_16 = next(ln for ln in text.splitlines() if ln.startswith("| (e) naive FastAPI endpoint | 640x480 | 16 |"))
    assert naive_16.count("void") == 3 and "73.0" not in naive_16 and naive_16.endswith("| 0.50 | 2/3 |")
    assert "| 640x480 | 94.2 (batch 4) | 73.0 | 1.30 | 0.70 | 86.1 |" in text
    tuned = "| 1 instance(s), max_batch_size 4 | n1 b1 82, n1 b4 94 |"
    assert f"| vit-ti16-random (patchserve) | 2 usable cores: 1 instance × 2 intra-op threads {tuned}" in text


def test_the_docs_page_is_written_between_its_markers(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\nintro\n\n{report.BEGIN}\nold tables\n{report.END}\n\nafter\n")
    report.write_docs("new tables", page)
    assert page.read_text() == f"# Performance\n\nintro\n\n{report.BEGIN}\nnew tables\n{report.END}\n\nafter\n"
    (tmp_path / "bare.md").write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        report.write_docs("x", tmp_path / "bare.md")


def test_a_measured_with_sessions_side_by_side_says_so_in_the_table() -> None:
    data = results()
    data["raw"]["4000x3000"] = data["raw"]["4000x3000"] | {
        "a": {"images_per_s": 51.0, "best_batch_size": 1, "sessions": 2, "intra_op_threads": 1}
    }
    text = report.markdown(data, "bench/results/x.json")
    assert "| 4000x3000 | 51.0 (batch 1, 2 sessions × 1 thread) | 73.0 |" in text
    assert "| 640x480 | 94.2 (batch 4) |" in text  # a results file from before: one default session
