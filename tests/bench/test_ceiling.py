"""The ceiling measured in every round (bench/ceiling.py): the pairing of each round's throughput with its
own round's ceiling, the schedule that puts it first in each round, the tables, and the probe's three
costs on a real model (its HTTP part stubbed: wrk is the benchmark's tool, not the suite's)."""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from bench import ceiling, decode, raw, report, run, servers
from bench.run import schedule

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
CHELSEA = Path(__file__).resolve().parents[1] / "images" / "skimage" / "chelsea.png"


def round_(i: int, throughput: float, void: str = "") -> dict:
    return {"round": i, "throughput": throughput, "p50_ms": 10.0, "p90_ms": 11.0, "p99_ms": 12.0, "errors": 0,
            "void": void, "load": {"foreign_cores": 0.5 if void else 0.01}}  # fmt: skip


def probe(i: int, images_per_s: float, void: str = "") -> dict:
    return {"round": i, "images_per_s": images_per_s, "ort_images_per_s": 60.0, "decode_cpu_ms": 1.4,
            "http_cpu_ms": 0.15, "void": void}  # fmt: skip


def test_each_round_is_divided_by_its_own_rounds_ceiling_and_the_median_taken() -> None:
    rounds = [round_(0, 50.0), round_(1, 60.0), round_(2, 45.0)]
    ceilings = [probe(2, 50.0), probe(0, 50.0), probe(1, 60.0)]  # in any order: paired by round
    paired = report.paired_ratio(rounds, ceilings)
    assert paired == {"median": pytest.approx(1.0), "min": pytest.approx(0.9), "max": pytest.approx(1.0)}
    # the same throughputs over one ceiling from another moment would say something else
    assert report.paired_ratio(rounds, [probe(i, 64.0) for i in range(3)])["median"] == pytest.approx(50 / 64)


def test_a_void_round_or_ceiling_or_a_round_without_one_gives_no_ratio() -> None:
    good = [probe(i, 50.0) for i in range(3)]
    assert report.paired_ratio([round_(0, 50.0), round_(1, 50.0, "loaded")], good) is None
    assert report.paired_ratio([round_(0, 50.0)], [probe(0, 50.0, "foreign processes took 0.30 cores")]) is None
    assert report.paired_ratio([round_(0, 50.0), round_(3, 50.0)], good) is None
    assert report.paired_ratio([], good) is None


def test_the_ceiling_is_measured_first_in_every_round_of_every_point() -> None:
    order = schedule(["640x480"], [1, 16], ["patchserve", "naive"], rounds=3, first=[ceiling.KEY])
    rounds = [[ceiling.KEY, "patchserve", "naive"], [ceiling.KEY, "naive", "patchserve"]]  # turned, probe first
    assert [key for _, _, _, key in order[:6]] == rounds[0] + rounds[1]
    probed = [(c, r) for _, c, r, key in order if key == ceiling.KEY]
    assert probed == [(1, 0), (1, 1), (1, 2), (16, 0), (16, 1), (16, 2)]


def results(with_probes: bool) -> dict:
    probes = {c: [probe(i, limit) for i, limit in enumerate((50.0, 60.0, 55.0))] for c in (16, 64)}  # one per point

    def point(server: str, c: int, throughputs: list[float]) -> dict:
        rounds = [round_(i, t) for i, t in enumerate(throughputs)]
        record = {"model": "m", "server": server, "label": server, "size": "640x480", "concurrency": c,
                  **report.summarise(rounds), "rounds_detail": rounds}  # fmt: skip
        if with_probes:
            record["ceiling_rounds"] = probes[c]  # every server of the point: the same rounds' ceilings
        return record

    http = [point("patchserve", c, [50.0, 54.0, 55.0]) for c in (16, 64)]
    http += [point("naive", c, [45.0, 45.0, 45.0]) for c in (16, 64)]
    data = {
        "started": "s", "finished": "f", "command": "make bench",
        "machine": {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "wrk": "wrk",
                    "versions": {"onnxruntime": "1.31.1", "litserve": "0.2.19"}},
        "model": {"name": "vit-ti16-random", "manifest": "ViT-Ti/16"},
        "protocol": {"seconds": 10, "warmup": 2, "rounds": 3},
        "servers": {"patchserve": {}, "naive": {}},
        "raw": {"640x480": {"a": {"images_per_s": 67.6, "best_batch_size": 1}, "b_sequential": {"images_per_s": 43.7},
                            "void": ""}},
        "ceiling": {"640x480": {"images_per_s": 64.3, "decode_cpu_ms": 1.37, "http_cpu_ms": 0.15, "void": False}},
        "http": http,
    }  # fmt: skip
    data["ratios"] = report.ratios(data)
    data["targets"] = report.targets(data)
    return data


def test_the_target_and_the_table_use_the_rounds_ceilings_and_old_files_the_start_one() -> None:
    paired = {t["target"]: t["value"] for t in results(with_probes=True)["targets"]}
    # rounds 50/50, 54/60, 55/55: median 1.0; over the start's 64.3 it would have been 54/64.3 = 0.84
    assert paired["640x480, c=16: patchserve / ceiling"] == pytest.approx(1.0)
    assert paired["640x480, c=64: patchserve / ceiling"] == pytest.approx(1.0)
    text = report.markdown(results(with_probes=True), "bench/results/x.json")
    assert "| 640x480 | 67.6 (batch 1) | 43.7 | 1.37 | 0.15 | 64.3 | 55.0 (50.0–60.0) of 6 |" in text
    row = "| patchserve | 640x480 | 16 | 54.0 (50.0–55.0) | 10.0 (10.0–10.0) | 12.0 (12.0–12.0) | 0 | 1.00 | 0.01 |"
    assert row in text
    assert "its own round's ceiling" in text
    start = {t["target"]: t["value"] for t in results(with_probes=False)["targets"]}
    assert start["640x480, c=16: patchserve / ceiling"] == pytest.approx(54.0 / 64.3)
    old = report.markdown(results(with_probes=False), "bench/results/x.json")
    assert "| 640x480 | 67.6 (batch 1) | 43.7 | 1.37 | 0.15 | 64.3 | — |" in old and "its own round's" not in old


def test_a_void_probe_shows_void_never_its_number() -> None:
    data = results(with_probes=True)
    data["http"][0]["ceiling_rounds"][1] = probe(1, 99.0, "foreign processes took 0.30 cores")
    data["ratios"], data["targets"] = report.ratios(data), report.targets(data)
    assert {t["target"]: t["met"] for t in data["targets"]}["640x480, c=16: patchserve / ceiling"] is None
    ratios = {(r["server"], r["concurrency"]): r["vs_ceiling"] for r in data["ratios"]}
    assert ratios[("patchserve", 16)] is None and ratios[("naive", 16)] is None  # the point's probes are shared
    assert ratios[("patchserve", 64)] == pytest.approx(1.0)
    text = report.markdown(data, "bench/results/x.json")
    assert "| 64.3 | void |" in text and "99.0" not in text
    for server in ("patchserve", "naive"):
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {server} | 640x480 | 16 |"))
        assert row.endswith("| 0 | void | 0.01 | 3/3 |")  # its own rounds were quiet; its ceiling was not
    assert "Quiet: 4 of 4 points and 5 of 6 round ceilings valid" in text


def test_the_probe_measures_ort_at_the_start_runs_best_configuration_and_the_decode_now(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = REPOSITORY / "vit-digits" / "1"
    image = tmp_path / "chelsea.jpg"
    Image.open(CHELSEA).convert("RGB").save(image, quality=90)
    seen = {}

    def http_cpu(server, path, files, *, concurrency, seconds, warmup) -> dict:
        seen.update(path=path, files=list(files), concurrency=concurrency)
        return {"cpu_ms_per_request": 0.25}

    monkeypatch.setattr(ceiling, "http_cpu", http_cpu)
    measured = raw.ort_best_batch

    def ort_best_batch(model_dir, files, **kwargs) -> dict:
        seen.update(ort=kwargs)
        return measured(model_dir, files, **kwargs)

    monkeypatch.setattr(raw, "ort_best_batch", ort_best_batch)
    best = {"640x480": {"images_per_s": 1.0, "best_batch_size": 2, "sessions": 2}}
    measure = ceiling.Probe(model, {"640x480": [image]}, best, cores=2, seconds=0.2, warmup=0)
    got = measure(echo=None, size="640x480")  # type: ignore[arg-type]  # the stub needs no server
    assert got["ort_images_per_s"] > 0 and got["decode_cpu_ms"] > 0 and got["http_cpu_ms"] == 0.25
    assert got["images_per_s"] == pytest.approx(
        report.ceiling(got["ort_images_per_s"], got["decode_cpu_ms"] / 1e3, 0.25e-3, 2)
    )
    assert seen == {"path": "/echo", "files": [image], "concurrency": 16,
                    "ort": {"seconds": 0.2, "batch_sizes": (2,), "sessions": 2}}  # fmt: skip


def test_the_ceilings_decode_cost_is_the_draft_decode_alone(tmp_path: Path) -> None:
    image = tmp_path / "chelsea.jpg"
    Image.open(CHELSEA).convert("RGB").save(image, quality=90)
    model = REPOSITORY / "vit-digits" / "1"
    alone = decode.decode_cost(model, [image], repeats=1, full=False)
    assert set(alone) == {"draft_ms"} and alone["draft_ms"] > 0
    both = decode.decode_cost(model, [image], repeats=1)
    assert {"draft_ms", "full_ms", "plain_decode_ms"} <= set(both)
    assert both["draft_over_full"] == pytest.approx(both["draft_ms"] / both["full_ms"])


def test_each_round_of_each_point_measures_the_ceiling_first_and_hands_it_to_every_server_of_the_point(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """bench.run.measure_http with the servers, wrk and the quiet check stubbed: the order and the pairing."""
    order: list = []

    @contextlib.contextmanager
    def all_running(everyone: list, log_dir: Path):
        yield {s.key: SimpleNamespace(key=s.key, url=f"http://{s.key}") for s in everyone}

    @contextlib.contextmanager
    def alone(running: dict, key: str):
        order.append(key)
        yield running[key]

    def measure_point(url: str, files: list, **_: object) -> dict:
        return round_(-1, 50.0 if "patchserve" in url else 45.0)  # run.measure_http sets the round

    class Probe:
        server = servers.echo()
        made = 0

        def __call__(self, echo: SimpleNamespace, size: str) -> dict:
            order.append(("probe", echo.key, size))
            Probe.made += 1
            return probe(-1, 50.0 + Probe.made)  # run.measure_http sets the round, the stubbed _quietly void

    monkeypatch.setattr(servers, "all_running", all_running)
    monkeypatch.setattr(servers, "alone", alone)
    monkeypatch.setattr(run, "expected_top1", lambda *_: 0)
    monkeypatch.setattr(run, "smoke_check", lambda *_: None)
    monkeypatch.setattr(run, "measure_point", measure_point)
    monkeypatch.setattr(run, "_quietly", lambda measure, what: measure() | {"void": ""})
    contestants = [s for s in servers.contestants(tmp_path, "m") if s.key in ("patchserve", "naive")]
    records = run.measure_http(
        contestants, {"640x480": [tmp_path / "a.jpg"]}, [1, 16], model="m", model_dir=tmp_path, seconds=1.0,
        warmup=0.0, rounds=2, log_dir=tmp_path, ceiling_probe=Probe(),  # type: ignore[arg-type]
    )  # fmt: skip
    probe_at = ("probe", "echo", "640x480")
    turns = ["echo", probe_at, "patchserve", "naive", "echo", probe_at, "naive", "patchserve"]  # the order turns
    assert order == turns * 2  # (c=1: 2 rounds, then c=16: 2 rounds)
    by = {(r["server"], r["concurrency"]): r for r in records}
    for c, first in ((1, 51.0), (16, 53.0)):
        ours, theirs = by[("patchserve", c)], by[("naive", c)]
        assert ours["ceiling_rounds"] is theirs["ceiling_rounds"]  # one point, one set of ceilings
        assert [(p["round"], p["images_per_s"]) for p in ours["ceiling_rounds"]] == [(0, first), (1, first + 1)]
        assert [r["round"] for r in ours["rounds_detail"]] == [0, 1]
        assert report.vs_ceiling({}, ours) == pytest.approx(statistics.median([50 / first, 50 / (first + 1)]))


def test_the_decode_cost_measures_each_mode_in_a_series_of_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A draft decode measured between full-size ones read 14.3 ms at 4000x3000, alone 9.2-12.6 (2026-12-07)."""
    image = tmp_path / "chelsea.jpg"
    Image.open(CHELSEA).convert("RGB").save(image, quality=90)
    modes: list[str] = []
    real = decode.decode_image

    def decode_image(data: bytes, **kwargs):
        modes.append("full" if kwargs["draft_size"] is None else "draft")
        return real(data, **kwargs)

    monkeypatch.setattr(decode, "decode_image", decode_image)
    decode.decode_cost(REPOSITORY / "vit-digits" / "1", [image, image], repeats=2)
    assert modes == ["draft"] * 4 + ["full"] * 4
