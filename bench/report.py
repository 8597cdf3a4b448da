"""Ratios, targets and the markdown table of one results file.

python -m bench.report bench/results/<date>-<host>.json     # the table the README shows
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PATCHSERVE = "patchserve"


def _point(results: dict, server: str, size: str, concurrency: int) -> dict | None:
    return next(
        (r for r in results["http"] if r["server"] == server and r["size"] == size and r["concurrency"] == concurrency),
        None,
    )


def ratios(results: dict) -> list[dict]:
    """Every HTTP figure divided by (a) and (b) of the same size, measured in the same run."""
    rows = []
    for r in results["http"]:
        baseline = results["raw"][r["size"]]
        rows.append(
            {
                "server": r["server"],
                "size": r["size"],
                "concurrency": r["concurrency"],
                "vs_a": r["throughput"] / baseline["a"]["images_per_s"],
                "vs_b_sequential": r["throughput"] / baseline["b_sequential"]["images_per_s"],
                "vs_b_threads": r["throughput"] / baseline["b_threads"]["images_per_s"],
            }
        )
    return rows


def targets(results: dict) -> list[dict]:
    """The issue's targets, each with the measured value and whether it was met (None: not measured)."""
    checks = []

    def check(name: str, value: float | None, bound: float, at_least: bool = True) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        checks.append({"target": name, "value": value, "bound": bound, "at_least": at_least, "met": met})

    def throughput(server: str, size: str, c: int) -> float | None:
        point = _point(results, server, size, c)
        return point["throughput"] if point else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else x / y

    small, large = "640x480", "4000x3000"
    ours = throughput(PATCHSERVE, small, 16)
    a = results["raw"].get(small, {}).get("a", {}).get("images_per_s")
    check("640x480, c=16: patchserve / (a) raw ORT best batch", ratio(ours, a), 0.90)
    check("640x480, c=16: patchserve / (f) LitServe", ratio(ours, throughput("litserve", small, 16)), 1.25)
    check("640x480, c=16: patchserve / (e) naive", ratio(ours, throughput("naive", small, 16)), 1.10)
    point = _point(results, PATCHSERVE, small, 16)
    check(
        "640x480, c=16: patchserve p99 / its own p50",
        ratio(point["p99_ms"], point["p50_ms"]) if point else None,
        1.30,
        at_least=False,
    )
    others = [t for t in (throughput("naive", large, 16), throughput("litserve", large, 16)) if t is not None]
    check(
        "4000x3000, c=16: patchserve / the better of (e), (f)",
        ratio(throughput(PATCHSERVE, large, 16), max(others) if others else None),
        1.20,
    )
    for size in (small, large):
        ours_1, naive_1 = _point(results, PATCHSERVE, size, 1), _point(results, "naive", size, 1)
        check(
            f"{size}, c=1: patchserve p50 / (e) naive p50",
            ratio(ours_1["p50_ms"], naive_1["p50_ms"]) if ours_1 and naive_1 else None,
            1.00,
            at_least=False,
        )
    return checks


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(results: dict, path: Path | str) -> str:
    """The README's performance tables for one results file."""
    m = results["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["load_average"])
    load_end = ", ".join(f"{x:.2f}" for x in m.get("load_average_end", m["load_average"]))
    lines = [
        f"Results: `{path}` ({results['started']}), `{results['command']}`.",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; load average (1, 5, 15 min) "
        f"{load} at the start, {load_end} at the end; onnxruntime {m['versions']['onnxruntime']}, "
        f"litserve {m['versions']['litserve']}, {m['wrk']}.",
        f"Model: {results['model']['name']}: {results['model']['manifest']}. "
        f"{results['protocol']['seconds']:.0f} s per point after {results['protocol']['warmup']:.0f} s of warm-up.",
        "",
        "| size | (a) ORT best batch, img/s | (b) decode + ORT, 1 thread | (b) decoding on 2 threads "
        "| decode + preprocess, ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    decode = results.get("decode", {})
    for size, r in results["raw"].items():
        lines.append(
            f"| {size} | {r['a']['images_per_s']:.1f} (batch {r['a']['best_batch_size']}) | "
            f"{r['b_sequential']['images_per_s']:.1f} | {r['b_threads']['images_per_s']:.1f} | "
            f"{r['b_sequential']['decode_ms']:.1f} |"
        )
    for size, d in decode.items():
        lines.append(
            f"\nJPEG draft mode, {size} to the model's input: {d['draft_ms']:.1f} ms of CPU per image, "
            f"{d['draft_over_plain_decode']:.2f}x a plain full-size decode ({d['plain_decode_ms']:.1f} ms) and "
            f"{d['draft_over_full']:.2f}x the same pipeline without draft mode ({d['full_ms']:.1f} ms)."
        )
    lines += [
        "",
        "| server | size | concurrency | req/s | p50 ms | p90 ms | p99 ms | errors | × (a) | × (b) 1 thread |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ratio_of = {(r["server"], r["size"], r["concurrency"]): r for r in results["ratios"]}
    order = list(results["servers"])
    for r in sorted(
        results["http"], key=lambda r: (r["size"] != "640x480", order.index(r["server"]), r["concurrency"])
    ):
        q = ratio_of[(r["server"], r["size"], r["concurrency"])]
        lines.append(
            f"| {r['label']} | {r['size']} | {r['concurrency']} | {r['throughput']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {q['vs_a']:.2f} | {q['vs_b_sequential']:.2f} |"
        )
    lines += ["", "| target | measured | bound | met |", "| --- | --- | --- | --- |"]
    for t in results["targets"]:
        bound = ("≥ " if t["at_least"] else "≤ ") + f"{t['bound']:.2f}"
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'])} | {bound} | {met} |")
    for trained in results.get("trained", []):
        a, b = trained["raw"]["a"]["images_per_s"], trained["raw"]["b_sequential"]["images_per_s"]
        lines += [
            "",
            f"Trained model `{trained['model']}`, {trained['size']} JPEGs: (a) {a:.0f} img/s at batch "
            f"{trained['raw']['a']['best_batch_size']}, (b) {b:.0f} img/s.",
            "",
            "| server | concurrency | req/s | p50 ms | p99 ms | errors |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in trained["http"]:
            lines.append(
                f"| {r['label']} | {r['concurrency']} | {r['throughput']:.1f} | {r['p50_ms']:.1f} | "
                f"{r['p99_ms']:.1f} | {r['errors']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    print(markdown(json.loads(args.results.read_text()), args.results))


if __name__ == "__main__":
    main()
