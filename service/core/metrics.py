"""Prometheus metrics (DESIGN.md, "Metrics"): base units, ``{model, version}`` labels.

Requests for unknown models are labelled ``model="_unknown"`` so bad input cannot create
unbounded series. Every series name and label set is defined here, once.

With several worker processes the series are aggregated across them with prometheus_client's
multiprocess mode: ``service.process.serve`` sets ``PROMETHEUS_MULTIPROC_DIR`` (and wipes it) before this
module or prometheus_client is imported anywhere, each worker writes its values to
memory-mapped files there, and :func:`exposition` merges them at every scrape. Counters and
histograms of a worker that died keep counting (its files stay); its live gauges are dropped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

UNKNOWN_MODEL = "_unknown"
OUTCOMES = ("success", "client_error", "rejected", "timeout", "cancelled", "error")
RELEASE_REASONS = ("size", "delay", "idle")  # why a batch left the queue (service/batching/batcher.py)

# Seconds: from 0.5 ms (a tiny model on an idle CPU) to 30 s (the default request timeout).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

REQUESTS = Counter("patchserve_requests", "Inference requests answered, by outcome.", ["model", "version", "outcome"])
REQUEST_DURATION = Histogram(
    "patchserve_request_duration_seconds",
    "Inference request duration, body read to response.",
    ["model", "version"],
    buckets=_LATENCY_BUCKETS,
)
DECODE_DURATION = Histogram(
    "patchserve_decode_duration_seconds",
    "Decoding and preprocessing one image.",
    ["model", "version"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_DURATION = Histogram(
    "patchserve_queue_duration_seconds",
    "Time an image waited in the batcher's queue.",
    ["model", "version"],
    buckets=_LATENCY_BUCKETS,
)
COMPUTE_DURATION = Histogram(
    "patchserve_compute_duration_seconds",
    "One model run (one batch).",
    ["model", "version"],
    buckets=_LATENCY_BUCKETS,
)
BATCHES = Counter(
    "patchserve_batches",
    "Batches released to the model, by why they left the queue: size, delay or idle.",
    ["model", "version", "reason"],
)
BATCH_SIZE = Histogram("patchserve_batch_size", "Images per model run.", ["model", "version"], buckets=_BATCH_BUCKETS)


class BatchSeries:
    """One model version's batch series: batches released (by reason), their sizes, queue and compute seconds."""

    def __init__(self, model: str, version: str) -> None:
        self.queue = QUEUE_DURATION.labels(model, version)
        self.compute = COMPUTE_DURATION.labels(model, version)
        self.size = BATCH_SIZE.labels(model, version)
        self.released = {reason: BATCHES.labels(model, version, reason) for reason in RELEASE_REASONS}

    def release(self, size: int, reason: str) -> None:
        """A batch of ``size`` inputs left the queue (or was run alone) for ``reason``."""
        self.released[reason].inc()
        self.size.observe(size)


PADDING_FRACTION = Histogram(
    "patchserve_padding_fraction",
    "Padded pixels over all pixels of the bucket an image was padded to (models with padding buckets only).",
    ["model", "version"],
    buckets=(0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0),
)
QUEUE_DEPTH = Gauge(
    "patchserve_queue_depth",
    "Images waiting in the batcher's queue.",
    ["model", "version"],
    multiprocess_mode="livesum",
)
MODEL_INFO = Gauge(
    "patchserve_model_info",
    "1 for each model version serving, with its task and execution provider; 0 once unloaded.",
    ["model", "version", "task", "provider"],
    multiprocess_mode="livemax",
)

MODEL_SETTING = Gauge(
    "patchserve_model_setting",
    "The values a model version serves with (instances, max_batch_size, intra_op_threads, spinning), chosen or set.",
    ["model", "version", "setting"],
    multiprocess_mode="livemax",
)
AUTOTUNE_THROUGHPUT = Gauge(
    "patchserve_autotune_images_per_second",
    "The auto-tuner's measured throughput at warm-up, by instance count and batch size.",
    ["model", "version", "instances", "batch_size"],
    multiprocess_mode="livemax",
)
MODEL_LOADS = Counter(
    "patchserve_model_loads",
    "Model version loads (start-up, polling, the load API), by outcome: success or failure.",
    ["model", "version", "outcome"],
)


def export_choices(model: Any) -> None:
    """A model version's chosen values and the auto-tuner's curve as gauges (a repository.ModelVersion)."""
    labels = (model.name, str(model.version))
    MODEL_SETTING.labels(*labels, "instances").set(model.batcher.instances)
    MODEL_SETTING.labels(*labels, "max_batch_size").set(model.batcher.config.max_batch_size)
    if model.threads is not None:
        MODEL_SETTING.labels(*labels, "intra_op_threads").set(model.threads.intra_op_threads)
        MODEL_SETTING.labels(*labels, "spinning").set(int(model.threads.spinning))
    if model.tuning is not None:
        for point in model.tuning.points:
            AUTOTUNE_THROUGHPUT.labels(*labels, str(point.instances), str(point.batch_size)).set(point.images_per_s)


def observe_request(model: str, version: str, outcome: str, seconds: float | None) -> None:
    """Count one answered inference request and, if it was timed, its duration in seconds."""
    assert outcome in OUTCOMES, outcome
    REQUESTS.labels(model, version, outcome).inc()
    if seconds is not None:
        REQUEST_DURATION.labels(model, version).observe(seconds)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


def _alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, killed but not yet reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rpartition(")")[2].split()[0] != "Z"


def mark_dead_workers(folder: Path) -> list[int]:
    """Drop the live gauges (queue depth, model info and settings) of worker processes that no longer run.

    Returns:
        The process ids marked dead.
    """
    dead = sorted({int(m.group(1)) for f in folder.iterdir() if (m := _LIVE_GAUGE_FILE.match(f.name))} - {os.getpid()})
    dead = [pid for pid in dead if not _alive(pid)]
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(folder))
    return dead


def exposition() -> tuple[bytes, str]:
    """The Prometheus text format of every series, and its content type.

    In multiprocess mode the values of every worker, live or dead, are merged (dead workers'
    live gauges dropped first); otherwise this process's default registry is used.
    """
    folder = os.environ.get(MULTIPROC_ENV)
    if not folder:
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    mark_dead_workers(Path(folder))
    try:
        return generate_latest(registry), CONTENT_TYPE_LATEST
    except FileNotFoundError:  # another worker dropped a dead worker's file while this one read: once more
        return generate_latest(registry), CONTENT_TYPE_LATEST
