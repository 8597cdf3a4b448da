"""Synthetic throughput curves for the tuner's tests."""

from __future__ import annotations

from service.runtime.tuning import Point


def curve(values: dict[int, list[float]], sizes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[Point]:
    return [Point(n, b, v) for n, row in values.items() for b, v in zip(sizes, row, strict=True)]
