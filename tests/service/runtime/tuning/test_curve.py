"""The auto-tuner's choice on synthetic throughput curves (service/runtime/tuning/curve.py); no test asserts a time."""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.tuning import Point, batch_sizes, choose
from tests.service.runtime.tuning.curves import curve


def test_a_flat_cpu_curve_picks_a_small_batch_and_one_instance() -> None:
    # ViT-Ti/16 on 2 cores (issue 14): b1 82, b4 94, b16 84 img/s; two instances no better.
    points = curve({1: [82, 90, 94, 91, 84], 2: [80, 88, 92, 90, 85]})
    assert choose(points) == Point(1, 2, 90)  # 90 >= 0.95 x 94


def test_a_rising_gpu_curve_picks_the_large_batch_that_still_pays() -> None:
    sizes = (1, 2, 4, 8, 16, 32, 64)
    points = curve({1: [100, 190, 360, 650, 1100, 1800, 1950], 2: [110, 200, 380, 700, 1200, 1900, 2000]}, sizes)
    assert choose(points) == Point(1, 64, 1950)  # 1950 >= 0.95 x 2000: one instance is enough
    assert choose(curve({1: [100, 190, 360, 650, 1100, 1800, 1850]}, sizes)) == Point(1, 32, 1800)


def test_noise_within_the_tolerance_does_not_buy_a_larger_batch() -> None:
    rng = np.random.default_rng(14)
    flat = 100 + rng.uniform(-2.4, 2.4, size=5)  # +-2.4 %: within 5 % of any maximum of it
    points = curve({1: flat.tolist()})
    assert choose(points).batch_size == 1
    assert choose(curve({1: [100, 101, 99, 100, 104.9]})).batch_size == 1  # one high reading at b16


def test_a_larger_batch_must_beat_a_smaller_one_by_more_than_the_rounds_spread() -> None:
    # ViT-Ti/16 on 2 busy cores, 3 rounds each: the medians say b8 by 16 %, the rounds say noise.
    noisy = [Point(1, 1, 47.7, 44.0, 52.0), Point(1, 2, 54.0, 50.0, 56.0), Point(1, 8, 55.2, 49.0, 57.0)]
    assert choose(noisy) == noisy[0]  # b1's best round (52) beat b8's worst (49)
    tight = [Point(1, 1, 47.7, 47.0, 48.0), Point(1, 2, 54.0, 53.5, 54.5), Point(1, 8, 55.2, 54.9, 55.6)]
    assert choose(tight) == tight[1]  # rounds that agree: b2 is within 5 % of b8, b1 is not
    rising = [Point(1, 1, 100, 99, 101), Point(1, 64, 1950, 1940, 1960)]
    assert choose(rising).batch_size == 64
    legacy = [Point(1, 1, 47.7), Point(1, 8, 55.2)]  # cached before rounds were kept: the medians alone
    assert choose(legacy).batch_size == 8


def test_a_second_instance_is_taken_only_when_it_pays() -> None:
    points = curve({1: [50, 55, 56, 55, 54], 2: [90, 98, 100, 99, 97]})
    assert choose(points) == Point(2, 2, 98)
    with pytest.raises(ValueError):
        choose([])


def test_batch_sizes_are_powers_of_two_up_to_the_bound() -> None:
    assert batch_sizes(16) == [1, 2, 4, 8, 16]
    assert batch_sizes(12) == [1, 2, 4, 8, 12]
    assert batch_sizes(1) == [1]
