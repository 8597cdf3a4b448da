"""The auto-tuner's result and its choice rule: the measured curve, and the point to serve with.

Which point wins: the fewest instances, then the smallest batch, that is as good as the best
measured: within ``tolerance`` (5 %) of it, or within the noise of the measurement (its highest
round reached the best point's lowest). On the CPU, where the curve is flat, that is a small
batch, which keeps latency low; on a GPU, where it rises steeply, the largest batch that still pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

TOLERANCE = 0.05  # within 5 % of the best throughput counts as as good


@dataclass(frozen=True)
class Point:
    """One measured point: ``instances`` sessions running batches of ``batch_size``, images per second.

    ``images_per_s`` is the median over the tuner's rounds; ``low`` and ``high`` the slowest and
    fastest round (None: not recorded, as in results cached before they were).
    """

    instances: int
    batch_size: int
    images_per_s: float
    low: float | None = None
    high: float | None = None


@dataclass
class TuneResult:
    """What the tuner chose and the curve it chose from.

    Attributes:
        instances, max_batch_size: the choice.
        points: the measured curve.
        source: "measured" (here, now) or "cache" (read from ``cache_file``).
        seconds: wall seconds the measurement took (0 when read from the cache).
        key: the cache key (graph hash, machine, threads, bounds).
        measured_at: ISO 8601 UTC time of the measurement.
        cache_file: where it is cached ("" when it could not be written or was not, the machine being busy).
        foreign_cores: CPU other processes took while it was measured, in cores.
    """

    instances: int
    max_batch_size: int
    points: list[Point]
    source: str = "measured"
    seconds: float = 0.0
    key: str = ""
    measured_at: str = ""
    cache_file: str = ""
    identity: dict[str, Any] = field(default_factory=dict)
    foreign_cores: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, the curve as a list of {instances, batch_size, images_per_s}."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        points = [Point(**p) for p in data.pop("points")]
        return cls(points=points, **data)

    def curve_text(self) -> str:
        """The curve on one line: "n=1: b1 82.0, b2 90.1, … img/s; n=2: …"."""
        by_n: dict[int, list[Point]] = {}
        for p in self.points:
            by_n.setdefault(p.instances, []).append(p)
        return "; ".join(
            f"n={n}: " + ", ".join(f"b{p.batch_size} {p.images_per_s:.1f}" for p in ps) + " img/s"
            for n, ps in sorted(by_n.items())
        )


def as_good(point: Point, best: Point, tolerance: float = TOLERANCE) -> bool:
    """``point`` cannot be told from ``best``: its median within ``tolerance`` of best's, or its fastest
    round at least best's slowest (the rounds' spread is the measurement's own noise)."""
    if point.images_per_s >= (1.0 - tolerance) * best.images_per_s:
        return True
    return point.high is not None and best.low is not None and point.high >= best.low


def choose(points: Sequence[Point], tolerance: float = TOLERANCE) -> Point:
    """The point to serve with: the fewest instances, then the smallest batch, as good as the best (:func:`as_good`).

    Fewer instances first: each then gets more of the cores, so a lone request runs faster, and
    fewer sessions hold less memory. The smallest batch next: a request waits for, and computes
    with, fewer others. A larger batch must beat a smaller one by more than the noise: on a
    CPU whose curve is flat, rounds 15 % apart picked batch 4 or 8 by chance (issue 14).

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("nothing was measured")
    best = max(points, key=lambda p: p.images_per_s)
    good = [p for p in points if as_good(p, best, tolerance)]
    return min(good, key=lambda p: (p.instances, p.batch_size))


def batch_sizes(bound: int) -> list[int]:
    """1, 2, 4, … up to ``bound``, and ``bound`` itself."""
    sizes = []
    b = 1
    while b < bound:
        sizes.append(b)
        b *= 2
    return [*sizes, bound]
