"""The ceiling measured again in every round, beside the contestants it is compared with.

The ceiling of :func:`bench.report.ceiling` rests on three costs of this machine: (a) ONNX Runtime's
images per second at its best batch, the CPU to decode and preprocess one image, and the CPU of
one request to an endpoint that only reads the body. Measured once at the start of a run, they
describe the machine at that moment, and a VM's cores do not keep one speed: on 2026-12-07 the
same decode took 12.90 ms of CPU at 08:30 UTC and 18.05 ms at 17:21, with nothing else in the VM
running (docs/performance.md), a change that ``bench/quiet.py`` cannot see (it counts other
processes and steal time, not a slower core). A throughput from one moment divided by a ceiling
from another then measures the host as much as the server.

So :class:`Probe` opens every round of :func:`bench.run.schedule` (its ``first``): in every round of
every point, before the servers, it measures the three costs again, shorter than at the start: ONNX
Runtime for 3 s at the batch size and sessions the start of the run found best (not the start's
sweep over batch sizes and configurations), the draft decode on the same files, the HTTP-alone
endpoint at the same wrk concurrency for 3 s after 1 s (the start's: 10 s after the point's
warm-up). Each server's round is divided by the ceiling of its own round
(:func:`bench.report.paired_ratio`) and the median taken. What it buys is a ceiling sampled over
the whole run instead of at one moment; it does not steady the ratio within a point, since the
host changes speed within a round too (2026-12-07, 19:22 UTC: the spread over rounds was 6.4 %
of the throughput and 6.9 % of the paired ratio).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench import decode, loadgen, quiet, raw, report, servers

KEY = "ceiling"  # its key in the schedule; never a server's
HTTP_CONCURRENCY = 16  # wrk's connections for the HTTP cost, at the start of the run and in the rounds


def http_cpu(
    server: servers.Running, path: str, files: Sequence[Path], *, concurrency: int, seconds: float, warmup: float
) -> dict:
    """CPU milliseconds per request of ``server`` (its process tree) under wrk at ``concurrency``.

    Returns:
        ``{"cpu_ms_per_request", "requests", "throughput", "concurrency"}``.
    """
    url = server.url + path
    if warmup > 0:
        loadgen.run(url, files, concurrency=concurrency, seconds=warmup)
    before = quiet.snapshot()
    result = loadgen.run(url, files, concurrency=concurrency, seconds=seconds)
    after = quiet.snapshot()
    spent = quiet.tree_cpu_seconds(before, after, {server.process.pid})
    return {
        "cpu_ms_per_request": 1e3 * spent / max(1, result.requests),
        "requests": result.requests,
        "throughput": result.throughput,
        "concurrency": concurrency,
    }


class Probe:
    """The three costs of one size's ceiling, measured now; called by the schedule in every round.

    Args:
        model_dir: the benchmark model's version folder (``model.onnx``, ``model.json``).
        files_by_size: the JPEGs of each size, as the servers are sent them.
        best: (a)'s start-of-run result by size (:func:`bench.raw.ort_best`): its best batch
            size and sessions are the configuration measured again.
        cores: the usable cores (the formula's divisor).
        seconds: seconds of ONNX Runtime and of wrk per measurement; ``warmup`` before wrk's.
        concurrency: wrk's connections for the HTTP cost (16, as at the start of the run).
    """

    def __init__(
        self,
        model_dir: Path,
        files_by_size: dict[str, list[Path]],
        best: dict[str, dict],
        *,
        cores: int,
        seconds: float = 3.0,
        warmup: float = 1.0,
        concurrency: int = HTTP_CONCURRENCY,
    ) -> None:
        self.model_dir, self.files_by_size, self.best = model_dir, files_by_size, best
        self.cores, self.seconds, self.warmup, self.concurrency = cores, seconds, warmup, concurrency
        self.server = servers.echo()

    def settings(self) -> dict:
        """What each measurement in a round is, for the results file's protocol."""
        return {"ort_seconds": self.seconds, "http_seconds": self.seconds, "http_warmup": self.warmup,
                "http_concurrency": self.concurrency, "decode": "draft decode alone, median of 3 repeats"}  # fmt: skip

    def __call__(self, echo: servers.Running, size: str) -> dict:
        """The ceiling of ``size`` from costs measured now, with the ``echo`` server the only one running.

        Returns:
            ``{"images_per_s", "ort_images_per_s", "decode_cpu_ms", "http_cpu_ms"}``; void-checked
            by the caller (:func:`bench.run._quietly`).
        """
        files, a = self.files_by_size[size], self.best[size]
        ort = raw.ort_best_batch(
            self.model_dir,
            files,
            seconds=self.seconds,
            batch_sizes=(a["best_batch_size"],),
            sessions=a.get("sessions", 1),
        )["images_per_s"]
        decode_ms = decode.decode_cost(self.model_dir, files, full=False)["draft_ms"]
        http_ms = http_cpu(
            echo, self.server.path, files, concurrency=self.concurrency, seconds=self.seconds, warmup=self.warmup
        )["cpu_ms_per_request"]
        return {
            "images_per_s": report.ceiling(ort, decode_ms / 1e3, http_ms / 1e3, self.cores),
            "ort_images_per_s": ort,
            "decode_cpu_ms": decode_ms,
            "http_cpu_ms": http_ms,
        }
