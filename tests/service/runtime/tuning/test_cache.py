"""The auto-tuner's cache (service/runtime/tuning/cache.py): its key, stale and busy-machine results."""

from __future__ import annotations

import json
from pathlib import Path

from service.runtime.tuning import Point, TuneCache, TuneResult, cache_key, tune
from tests.service.runtime.tuning.curves import curve


def test_the_cache_key_changes_with_the_graph_the_machine_and_the_request() -> None:
    machine = {"cpu": "AMD EPYC", "cores": 2, "gpus": [], "onnxruntime": "1.31.1", "provider": "CPUExecutionProvider"}
    request = {"instances": [1, 2], "batch_sizes": [1, 2, 4], "threads": {"1": [2, True], "2": [1, True]}}
    key = cache_key("a" * 64, machine, request)
    assert key == cache_key("a" * 64, dict(machine), dict(request))  # deterministic, order-free
    assert key != cache_key("b" * 64, machine, request)  # another graph
    assert key != cache_key("a" * 64, {**machine, "cores": 4}, request)  # another CPU budget
    assert key != cache_key("a" * 64, {**machine, "gpus": ["NVIDIA H200"]}, request)  # another GPU
    assert key != cache_key("a" * 64, {**machine, "onnxruntime": "1.32.0"}, request)
    assert key != cache_key("a" * 64, machine, {**request, "batch_sizes": [1, 2, 4, 8]})


def test_a_cached_result_is_read_instead_of_measured_and_a_stale_one_is_not(tmp_path: Path) -> None:
    cache = TuneCache(tmp_path)
    calls: list[int] = []

    def run_measurement() -> list[Point]:
        calls.append(1)
        return curve({1: [82, 90, 94, 91, 84]})

    first = tune("m", 1, "k" * 64, cache=cache, run_measurement=run_measurement)
    assert (first.source, first.instances, first.max_batch_size, len(calls)) == ("measured", 1, 2, 1)
    again = tune("m", 1, "k" * 64, cache=cache, run_measurement=run_measurement)
    assert (again.source, again.points, len(calls)) == ("cache", first.points, 1)
    assert again.cache_file == first.cache_file and Path(first.cache_file).is_file()

    other = tune("m", 1, "j" * 64, cache=cache, run_measurement=run_measurement)  # a new graph or machine
    assert other.source == "measured" and len(calls) == 2

    stale = json.loads(Path(first.cache_file).read_text()) | {"key": "x" * 64}  # a file that is not for this key
    Path(first.cache_file).write_text(json.dumps(stale))
    assert cache.load("m", 1, "k" * 64) is None
    Path(first.cache_file).write_text("{not json")
    assert cache.load("m", 1, "k" * 64) is None
    assert TuneResult.from_dict(first.to_dict()) == first


def test_a_result_measured_on_a_busy_machine_is_used_but_not_cached(tmp_path: Path) -> None:
    cache = TuneCache(tmp_path)
    readings = iter([(100.0, 10.0), (104.0, 11.0)])  # the machine busy 4 CPU s, of which this process 1
    clocks = lambda: next(readings)  # noqa: E731
    result = tune("m", 1, "b" * 64, cache=cache, run_measurement=lambda: [Point(1, 2, 90.0)], clocks=clocks)
    assert result.max_batch_size == 2 and result.foreign_cores > 0.25
    assert result.source == "measured on a busy machine: not cached" and result.cache_file == ""
    assert cache.load("m", 1, "b" * 64) is None and not list(tmp_path.glob("*.json"))
