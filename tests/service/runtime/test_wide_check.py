"""The wide session is left out where a lone input runs slower on it (Loader._wide_if_it_pays).

The timing is injected (``Loader.lone_timer``): no test depends on how fast this machine runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.batching.config import BatchingConfig
from service.runtime.cpus import UsableCpus, plan_threads
from service.runtime.loading import Loader
from service.runtime.tuning import Tuner
from service.runtime.tuning.measure import lone_run_seconds, wide_pays
from tests.conftest import MODEL_REPOSITORY


class Timer:
    """Answers (instance seconds, wide seconds) as told, and records the inputs it was given."""

    def __init__(self, instance: float, wide: float) -> None:
        self.seconds = (instance, wide)
        self.calls: list[tuple[np.ndarray, ...]] = []

    def __call__(self, instance, wide, args):
        self.calls.append(args)
        return self.seconds


def loader(timer: Timer, *, tuned: bool = True, wide: bool | None = None) -> Loader:
    # A fixed max_batch_size and the instances planned beside a wide session: the tuner has nothing to measure.
    return Loader(
        device="cpu",
        batching=BatchingConfig(4, 0.002, 16),
        threads=plan_threads(UsableCpus(2, 2), wide=wide),
        tuner=Tuner(cache=None) if tuned else None,
        batch_size_fixed=True,
        lone_timer=timer,
    )


def version(name: str, number: int = 1) -> Path:
    return MODEL_REPOSITORY / name / str(number)


def test_a_wide_session_that_runs_a_lone_input_slower_is_left_out_and_the_reason_says_so() -> None:
    timer = Timer(instance=0.062e-3, wide=0.107e-3)  # vit-digits on 2 cores, as measured once
    model = loader(timer).load("vit-digits", 1, version("vit-digits"))
    assert model.wide is None and model.threads is not None and model.threads.wide_threads == 0
    assert "no wide session: a lone run took 0.107 ms on it and 0.062 ms on one instance" in model.threads.reason
    assert model.threads.instances == 2 and model.batcher.instances == 2
    [args] = timer.calls
    assert [a.shape for a in args] == [(1, *model.preprocessor.output_shape)] and args[0].dtype == np.float32


def test_a_wide_session_that_pays_is_kept() -> None:
    timer = Timer(instance=14.3e-3, wide=8.6e-3)  # ViT-Ti/16 on 2 cores
    model = loader(timer).load("vit-digits", 1, version("vit-digits"))
    assert model.wide is not None and model.threads is not None and model.threads.wide_threads == 2
    assert "a 2-thread wide session for lone requests" in model.threads.reason and len(timer.calls) == 1


def test_a_detector_is_timed_with_its_first_bucket_and_pixel_mask() -> None:
    timer = Timer(instance=1.0, wide=2.0)
    model = loader(timer).load("detr-digits", 2, version("detr-digits", 2))  # version 2 pads to buckets
    [(x, mask)] = timer.calls
    bucket = model.preprocessor.spec.buckets[0]
    assert x.shape[2:] == (bucket.height, bucket.width) and mask.shape == (1, bucket.height, bucket.width)
    assert mask.dtype == np.int64 and model.wide is None


@pytest.mark.parametrize(
    "how",
    [
        {"wide": True},  # forced on by a setting: kept, not measured
        {"tuned": False},  # the auto-tuner off (as in this suite): nothing is measured at start-up
    ],
)
def test_nothing_is_measured_when_the_wide_session_is_set_or_the_tuner_is_off(how: dict) -> None:
    timer = Timer(instance=1.0, wide=2.0)
    model = loader(timer, **how).load("vit-digits", 1, version("vit-digits"))
    assert timer.calls == [] and model.wide is not None


def test_nothing_is_measured_for_a_version_loaded_while_others_serve() -> None:
    timer = Timer(instance=1.0, wide=2.0)
    model = loader(timer).load("vit-digits", 1, version("vit-digits"), live=True)
    assert timer.calls == [] and model.wide is not None


def test_wide_pays_unless_it_is_slower() -> None:
    assert wide_pays(1.0, 1.0 / 1.66) and wide_pays(1.0, 1.0 / 1.28) and wide_pays(1.1, 1.0)
    assert wide_pays(3.633, 3.523)  # vit-cifar10 at the start of the 07:56 benchmark run (2026-12-07): kept now
    assert wide_pays(1.0, 1.0)
    assert not wide_pays(0.086, 0.116) and not wide_pays(0.062, 0.107)  # vit-digits: slower on two threads


def test_lone_run_seconds_alternates_the_two_and_takes_each_ones_fastest_run() -> None:
    now = [0.0]
    order: list[str] = []

    def runner(label: str, costs: list[float]):
        def run(x: np.ndarray) -> None:
            order.append(label)
            now[0] += costs.pop(0)

        return run

    # The first run of each is uncounted. The wide session's last three runs fall in a slow phase
    # (about one instance's speed): its median would be 1.0, its capability is 0.5.
    instance = runner("i", [0.1, 1.0, 1.1, 50.0, 1.0])
    wide = runner("w", [0.1, 0.5, 1.0, 1.0, 1.0])
    args = (np.zeros((1, 1, 2, 2), np.float32),)
    seconds = lone_run_seconds(instance, wide, args, runs=4, budget_seconds=1e3, clock=lambda: now[0])
    assert seconds == (1.0, 0.5)
    assert wide_pays(*seconds)
    assert order == ["i", "w"] * 5


def test_a_wide_session_slower_at_its_best_is_left_out() -> None:
    now = [0.0]

    def run(costs: list[float]):
        def call(x: np.ndarray) -> None:
            now[0] += costs.pop(0)

        return call

    # vit-digits at the start of the 08:30 benchmark run (2026-12-07): 0.086 and 0.116 ms at the fastest
    instance = run([1.0, 0.090e-3, 0.086e-3, 0.088e-3])
    wide = run([1.0, 0.121e-3, 0.116e-3, 0.119e-3])
    alone, widened = lone_run_seconds(
        instance, wide, (np.zeros((1,), np.float32),), runs=3, budget_seconds=1e3, clock=lambda: now[0]
    )
    assert (alone, widened) == (pytest.approx(0.086e-3), pytest.approx(0.116e-3))
    assert not wide_pays(alone, widened)


def test_lone_run_seconds_stops_at_its_budget_after_three_turns() -> None:
    now = [0.0]

    def run(x: np.ndarray) -> None:
        now[0] += 1.0

    calls = []
    counted = lambda x: (calls.append(1), run(x))  # noqa: E731
    lone_run_seconds(counted, run, (np.zeros((1,), np.float32),), runs=50, budget_seconds=2.0, clock=lambda: now[0])
    assert len(calls) == 1 + 3  # one uncounted, then three turns although the budget ran out after the first


def test_lone_run_seconds_needs_a_run() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        lone_run_seconds(lambda x: None, lambda x: None, (np.zeros((1,), np.float32),), runs=0)
