"""What patchserve's ``/metrics`` says happened between two scrapes: one model's histograms, subtracted.

Scrape before and after a measured round, read each text with :func:`histogram`, subtract with
:meth:`Histogram.minus`, and :func:`batch_stats` turns the batch-size and padding deltas into the
round's batches (``service/core/metrics.py`` defines both histograms).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram of one model: cumulative counts by upper bound, the count and the sum."""

    buckets: dict[float, float]
    count: float
    sum: float

    def minus(self, before: Histogram) -> Histogram:
        """What was observed between ``before`` and this scrape."""
        return Histogram(
            {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.count - before.count,
            self.sum - before.sum,
        )


def histogram(exposition: str, name: str, model: str) -> Histogram:
    """The histogram ``name`` (without ``_bucket``) of ``model`` in a ``/metrics`` text; empty when absent."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(exposition):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == name + "_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == name + "_count":
                count = sample.value
            elif sample.name == name + "_sum":
                total = sample.value
    return Histogram(buckets, count, total)


def batch_stats(batches: Histogram, padding: Histogram) -> dict[str, Any]:
    """Batches formed in a round: ``patchserve_batch_size`` and ``patchserve_padding_fraction`` deltas.

    Returns:
        batches, images, singles (batches of one image), mean_batch (images per batch), share_over_1
        (batches of 2 images or more over all batches), padding (mean padded share of a bucket's pixels
        per image; None without padding).
    """
    singles = batches.buckets.get(1.0, 0.0)  # cumulative: batches of at most 1 image
    return {
        "batches": int(batches.count),
        "images": int(batches.sum),
        "singles": int(singles),
        "mean_batch": batches.sum / batches.count if batches.count else None,
        "share_over_1": (batches.count - singles) / batches.count if batches.count else None,
        "padding": padding.sum / padding.count if padding.count else None,
    }
