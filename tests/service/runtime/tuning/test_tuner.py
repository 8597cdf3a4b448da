"""The auto-tuner (service/runtime/tuning/tuner.py): one measurement across workers, and the server using it.

No test asserts a time: measurements run on fake models and a fake clock, or on the real
server with a tiny budget, and only the structure of what was measured is checked.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import multiprocessing
import shutil
from pathlib import Path

import pytest

from service.runtime.tuning import Point, TuneCache, tune
from tests.conftest import MODEL_REPOSITORY, make_settings, running_app


def _tune_in_another_process(folder: str, marks: str) -> int:
    def run_measurement() -> list[Point]:
        with open(marks, "a") as f:
            f.write("measured\n")
        return [Point(1, 4, 100.0)]

    # The machine reads as quiet: the sibling processes starting up (importing numpy) would
    # otherwise count as foreign load, leave the first result uncached and let a second worker
    # measure too (the busy rule has its own test). Deterministic on a loaded machine.
    quiet = lambda: (0.0, 0.0)  # noqa: E731
    cache = TuneCache(Path(folder))
    return tune("m", 1, "s" * 64, cache=cache, run_measurement=run_measurement, clocks=quiet).max_batch_size


def test_several_workers_measure_once_and_the_others_read_the_result(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.touch()
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        chosen = pool.starmap(_tune_in_another_process, [(str(tmp_path / "cache"), str(marks))] * 3)
    assert chosen == [4, 4, 4]
    assert marks.read_text() == "measured\n"


def one_model_repository(tmp_path: Path, batching: dict | None = None) -> Path:
    root = tmp_path / "repository"
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", root / "vit-digits")
    if batching is not None:
        manifest = root / "vit-digits" / "1" / "model.json"
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"batching": batching}))
    return root


# The busy threshold is lifted: the suite runs beside other work, and these tests check the cache, not the load.
TUNED = {
    "auto_tune": True,
    "instances": None,
    "tune_point_seconds": 0.02,
    "tune_max_batch_size": 4,
    "tune_busy_cores": 64,
    "wide_session": False,  # so that the instance count is tuned too (a wide session fixes it: see below)
}


@pytest.mark.anyio
async def test_the_server_tunes_at_warm_up_shows_the_curve_and_reads_it_back_on_restart(tmp_path: Path) -> None:
    settings = make_settings(model_repository=one_model_repository(tmp_path), tune_cache=tmp_path / "cache", **TUNED)
    async with running_app(settings) as client:
        described = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
        metrics = (await client.get("/metrics")).text
    tuning, threads = described["autotune"], described["threads"]
    share = threads["usable_cores"]  # one model, one worker: every usable core
    expected = {(n, b) for n in range(1, min(2, share) + 1) for b in (1, 2, 4)}
    measured = {(p["instances"], p["batch_size"]) for p in tuning["curve"]}
    assert tuning["source"] == "measured" and measured <= expected and (1, 1) in measured
    assert described["batching"]["max_batch_size"] == tuning["chosen"]["max_batch_size"]
    assert described["instances"] == threads["instances"] == tuning["chosen"]["instances"]
    assert threads["intra_op_threads"] == max(1, share // threads["instances"])
    assert f"{share} usable core" in threads["reason"]
    assert (
        'patchserve_autotune_images_per_second{batch_size="1",instances="1",model="vit-digits",version="1"}' in metrics
    )
    assert 'patchserve_model_setting{model="vit-digits",setting="max_batch_size",version="1"}' in metrics

    async with running_app(settings) as client:
        again = (await client.get("/v1/models/vit-digits")).json()["versions"][0]["autotune"]
    assert again["source"] == "cache" and again["curve"] == tuning["curve"]


@pytest.mark.anyio
async def test_a_shutdown_during_start_up_stops_the_tuner_and_caches_nothing(tmp_path: Path, monkeypatch) -> None:
    # Found by an ops tester: SIGTERM while the models loaded was obeyed only once every model had
    # been tuned and warmed up (18.8 s with one worker, 34.9 s with two), past a pod's grace period.
    from service.core import lifecycle
    from service.http.app import create_app

    measuring = importlib.import_module("service.runtime.tuning.measure")  # the package exports measure()
    tuner = importlib.import_module("service.runtime.tuning.tuner")

    points: list[int] = []

    def first_point_then_the_signal(runners, batch, seconds: float) -> float:
        points.append(len(batch))
        lifecycle.request_shutdown()  # as the signal handler does, while this point is measured
        return measuring.measure_point(runners, batch, seconds)

    monkeypatch.setattr(tuner, "measure", functools.partial(measuring.measure, measure_one=first_point_then_the_signal))
    settings = make_settings(model_repository=one_model_repository(tmp_path), tune_cache=tmp_path / "cache", **TUNED)
    app = create_app(settings)
    state = app.state.server
    try:
        async with app.router.lifespan_context(app):
            for _ in range(6000):  # a bound on waiting, never a measured figure
                if state.startup_error or state.repository is not None:  # stopped, or loaded regardless
                    break
                await asyncio.sleep(0.01)
    finally:
        lifecycle.clear_shutdown()
    assert state.startup_error == "shutting down: loading the models stopped"
    assert state.repository is None and points == [1]  # the point under way ended, no other started
    assert list((tmp_path / "cache").glob("*.json")) == []  # a stopped measurement is not kept


@pytest.mark.anyio
async def test_a_manifests_batching_section_and_explicit_settings_win_over_the_tuner(tmp_path: Path) -> None:
    repository = one_model_repository(tmp_path, batching={"max_batch_size": 3})
    settings = make_settings(model_repository=repository, tune_cache=tmp_path / "cache", **TUNED)
    async with running_app(settings) as client:
        described = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
    assert described["batching"]["max_batch_size"] == 3
    assert {p["batch_size"] for p in described["autotune"]["curve"]} == {3}  # only the instance count was tuned
    assert "from the manifest's batching section" in described["autotune"]["note"]

    fixed = make_settings(model_repository=repository, tune_cache=tmp_path / "cache", **TUNED | {"instances": 1})
    async with running_app(fixed) as client:
        described = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
    assert described["autotune"] == {"source": "not tuned: max_batch_size from the manifest's batching section and "
                                     "instances set (PATCHSERVE_INSTANCES)"}  # fmt: skip
    assert described["threads"]["forced"] == ["decode_threads", "instances", "wide"]


@pytest.mark.anyio
async def test_with_a_wide_session_the_tuner_measures_batch_sizes_at_the_planned_instances(tmp_path: Path) -> None:
    # The wide session is set: chosen, it would be kept only if a lone run is faster on it, a timing
    # (test_wide_check.py injects it).
    settings = make_settings(
        model_repository=one_model_repository(tmp_path), tune_cache=tmp_path / "cache", **TUNED | {"wide_session": True}
    )
    async with running_app(settings) as client:
        described = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
    threads, tuning = described["threads"], described["autotune"]
    share = threads["usable_cores"]
    if share < 2:  # one core: one instance has every core
        assert threads["instances"] == 1
        return
    planned = (threads["instances"], threads["intra_op_threads"], threads["wide_session_threads"])
    assert planned == (2, share // 2, share)
    assert {p["instances"] for p in tuning["curve"]} == {2} and tuning["chosen"]["instances"] == 2
    assert f"a {share}-thread wide session for lone requests" in threads["reason"]
    assert tuning["note"] == "tuned; kept instances planned beside a wide session"


@pytest.mark.anyio
async def test_the_tuner_is_off_in_the_test_suite_by_default() -> None:
    async with running_app() as client:
        described = (await client.get("/v1/models/vit-digits")).json()["versions"][0]
    assert described["autotune"] == {"source": "off"} and described["batching"]["max_batch_size"] == 8
