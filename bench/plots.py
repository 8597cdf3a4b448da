"""PNG plots of one results file: throughput vs concurrency, latency percentiles vs concurrency (medians).

python -m bench.plots bench/results/<date>-<host>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench import report

MARKERS = {"patchserve": "o", "patchserve-no-batching": "s", "naive": "^", "litserve": "D"}


def plot(results: dict, stem: Path) -> list[Path]:
    """Write ``<stem>-throughput.png`` and ``<stem>-latency.png``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    sizes = list(results["raw"])
    servers = list(results["servers"])
    labels = {key: value["label"] for key, value in results["servers"].items()}
    title = f"{results['model']['name']} on {results['machine']['cpu']} ({results['machine']['cores']} cores)"

    def series(server: str, size: str, key: str) -> tuple[list[int], list[float]]:
        points = sorted(  # void points (the machine was not quiet) are left out
            (r["concurrency"], r[key])
            for r in results["http"]
            if r["server"] == server and r["size"] == size and not r.get("void")
        )
        return [c for c, _ in points], [v for _, v in points]

    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for server in servers:
            xs, ys = series(server, size, "throughput")
            ax.plot(xs, ys, marker=MARKERS.get(server, "o"), label=labels[server])
        raw = results["raw"][size]
        ax.axhline(raw["a"]["images_per_s"], color="black", linestyle="--", label="(a) ORT best batch")
        ax.axhline(raw["b_sequential"]["images_per_s"], color="grey", linestyle=":", label="(b) decode + ORT")
        limit = results.get("ceiling", {}).get(size)
        probes = report.ceiling_probes(results).get(size, [])
        if probes and not any(c["void"] for c in probes):  # measured in every round (bench/ceiling.py)
            values = [c["images_per_s"] for c in probes]
            ax.axhspan(min(values), max(values), color="tab:red", alpha=0.1)
            label = "ceiling in the rounds (median, min–max)"
            ax.axhline(statistics.median(values), color="tab:red", linestyle="-.", label=label)
        elif limit and not limit["void"]:
            ax.axhline(limit["images_per_s"], color="tab:red", linestyle="-.", label="ceiling (measured costs)")
        ax.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="requests/s", title=f"{size} JPEGs")
        ax.set_xticks(results["protocol"]["concurrency"], [str(c) for c in results["protocol"]["concurrency"]])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Throughput — {title}", fontsize=10)
    fig.tight_layout()
    throughput = stem.with_name(stem.name + "-throughput.png")
    fig.savefig(throughput, dpi=110)
    plt.close(fig)

    percentiles = ("p50_ms", "p90_ms", "p99_ms")
    fig, axes = plt.subplots(len(sizes), 3, figsize=(15, 4 * len(sizes)), squeeze=False, sharex=True)
    for row, size in enumerate(sizes):
        for col, key in enumerate(percentiles):
            ax = axes[row][col]
            for server in servers:
                xs, ys = series(server, size, key)
                ax.plot(xs, ys, marker=MARKERS.get(server, "o"), label=labels[server])
            ax.set(xscale="log", yscale="log", title=f"{size}: {key.removesuffix('_ms')} latency", ylabel="ms")
            ax.set_xticks(results["protocol"]["concurrency"], [str(c) for c in results["protocol"]["concurrency"]])
            ax.grid(alpha=0.3, which="both")
            if row == len(sizes) - 1:
                ax.set_xlabel("concurrency")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Latency percentiles — {title}", fontsize=10)
    fig.tight_layout()
    latency = stem.with_name(stem.name + "-latency.png")
    fig.savefig(latency, dpi=110)
    plt.close(fig)
    return [throughput, latency]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    for path in plot(json.loads(args.results.read_text()), args.results.with_suffix("")):
        print(path)


if __name__ == "__main__":
    main()
