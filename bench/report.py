"""Medians over rounds, the ceiling, ratios, the issue's targets and the markdown tables of one results file.

    python -m bench.report bench/results/<date>-<host>.json                    # print the tables
    python -m bench.report bench/results/<date>-<host>.json --docs docs/performance.md

A point measured while the machine was not quiet (``bench.quiet``) is void: it is reported as
void, never as a number, in every table, and a target that needs it is "void", not met or missed.
``--docs`` writes the tables between the ``<!-- bench:begin -->`` and ``<!-- bench:end -->``
markers of that page.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

PATCHSERVE = "patchserve"
METRICS = ("throughput", "p50_ms", "p90_ms", "p99_ms")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def ceiling(ort_images_per_s: float, decode_cpu_s: float, http_cpu_s: float, cores: int) -> float:
    """Images per second a server could serve at best on ``cores``: every core busy with useful work only.

    ``1 / (1/ort + (decode + http)/cores)``: ORT at its best batch costs ``cores / ort`` CPU
    seconds per image (it keeps every core busy), decoding and the HTTP request their own CPU
    seconds; the cores' capacity divided by the sum.

    Args:
        ort_images_per_s: (a), ONNX Runtime alone on pre-decoded tensors, best batch.
        decode_cpu_s: CPU seconds to decode and preprocess one image.
        http_cpu_s: CPU seconds of one request to an endpoint that only reads the body.
        cores: the usable cores.
    """
    return 1.0 / (1.0 / ort_images_per_s + (decode_cpu_s + http_cpu_s) / cores)


def summarise(rounds: Sequence[dict]) -> dict:
    """One point's rounds -> medians, minima and maxima over the valid rounds; void if any round was.

    Each round is a wrk result (``throughput``, ``p50_ms``, …, ``errors``) with ``void`` ("" or why).
    """
    valid = [r for r in rounds if not r["void"]]
    summary: dict = {"rounds_valid": len(valid), "rounds": len(rounds)}
    for key in METRICS:
        values = [r[key] for r in valid]
        summary[key] = statistics.median(values) if values else None
        summary[f"{key}_min"] = min(values) if values else None
        summary[f"{key}_max"] = max(values) if values else None
    summary["errors"] = sum(r["errors"] for r in rounds)
    summary["void_reasons"] = [r["void"] for r in rounds if r["void"]]
    summary["void"] = not valid or len(valid) < len(rounds)
    summary["foreign_cores_max"] = max((r["load"]["foreign_cores"] for r in rounds), default=0.0)
    return summary


def _point(points: list[dict], server: str, size: str, concurrency: int) -> dict | None:
    return next(
        (r for r in points if r["server"] == server and r["size"] == size and r["concurrency"] == concurrency), None
    )


def _value(point: dict | None, key: str) -> float | None:
    return None if point is None or point["void"] else point[key]


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else x / y


def paired_ratio(rounds: Sequence[dict], ceilings: Sequence[dict]) -> dict | None:
    """Each round's throughput over the ceiling measured in the same round: median, min and max.

    ``rounds`` are a point's wrk results and ``ceilings`` the probes of the same point, each with
    ``round`` (its index), ``void`` ("" or why) and a throughput or ``images_per_s``. None (void)
    when any of either is void or a round has no ceiling: a ratio is never taken across rounds.
    """
    by_round = {c["round"]: c for c in ceilings}
    if not rounds or any(r["void"] for r in rounds) or any(c["void"] for c in ceilings):
        return None
    if any(r.get("round") not in by_round for r in rounds):
        return None
    values = [r["throughput"] / by_round[r["round"]]["images_per_s"] for r in rounds]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def vs_ceiling(results: dict, point: dict | None) -> float | None:
    """A point's throughput as a fraction of the ceiling (None: void or not measured).

    With the ceiling measured in every round (``ceiling_rounds``, :mod:`bench.ceiling`): the median
    over rounds of each round's throughput over its own round's ceiling. Results files without
    them: the median throughput over the ceiling measured at the start of the run.
    """
    if point is None:
        return None
    if "ceiling_rounds" in point:
        paired = paired_ratio(point["rounds_detail"], point["ceiling_rounds"])
        return None if paired is None else paired["median"]
    limit = results.get("ceiling", {}).get(point["size"], {})
    return _ratio(_value(point, "throughput"), None if limit.get("void", True) else limit["images_per_s"])


def ratios(results: dict) -> list[dict]:
    """Every HTTP point's median throughput divided by (a), (b) and the ceiling of its size (None: void)."""
    rows = []
    for r in results["http"]:
        raw = results["raw"][r["size"]]
        ours = _value(r, "throughput")
        rows.append(
            {
                "server": r["server"],
                "size": r["size"],
                "concurrency": r["concurrency"],
                "vs_a": _ratio(ours, None if raw.get("void") else raw["a"]["images_per_s"]),
                "vs_b_sequential": _ratio(ours, None if raw.get("void") else raw["b_sequential"]["images_per_s"]),
                "vs_ceiling": vs_ceiling(results, r),
            }
        )
    return rows


def targets(results: dict) -> list[dict]:
    """Issue 14's acceptance, each with the measured value and whether it was met (None: void or not measured)."""
    checks = []

    def check(name: str, value: float | None, bound: float, at_least: bool = True) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        checks.append({"target": name, "value": value, "bound": bound, "at_least": at_least, "met": met})

    http = results["http"]
    for size in ("640x480", "4000x3000"):
        for c in (16, 64):
            ours = _value(_point(http, PATCHSERVE, size, c), "throughput")
            for other, bound in (("naive", 1.05), ("litserve", 1.25)):
                theirs = _value(_point(http, other, size, c), "throughput")
                check(f"{size}, c={c}: patchserve / {other}", _ratio(ours, theirs), bound)
            check(f"{size}, c={c}: patchserve / ceiling", vs_ceiling(results, _point(http, PATCHSERVE, size, c)), 0.92)
        ours_1, naive_1 = _point(http, PATCHSERVE, size, 1), _point(http, "naive", size, 1)
        p50 = _ratio(_value(ours_1, "p50_ms"), _value(naive_1, "p50_ms"))
        check(f"{size}, c=1: patchserve p50 / naive p50", p50, 1.0, at_least=False)
        ours_16 = _point(http, PATCHSERVE, size, 16)
        tail = _ratio(_value(ours_16, "p99_ms"), _value(ours_16, "p50_ms"))
        check(f"{size}, c=16: patchserve p99 / its p50", tail, 1.3, at_least=False)
    for trained in results.get("trained", []):
        name, points, size = trained["model"], trained["http"], trained["size"]
        ours, naive = _point(points, PATCHSERVE, size, 16), _point(points, "naive", size, 16)
        check(f"{name}, c=16: patchserve / naive", _ratio(_value(ours, "throughput"), _value(naive, "throughput")), 1.0)
        ours, naive = _point(points, PATCHSERVE, size, 1), _point(points, "naive", size, 1)
        p50 = _ratio(_value(ours, "p50_ms"), _value(naive, "p50_ms"))
        check(f"{name}, c=1: patchserve p50 / naive p50", p50, 1.0, at_least=False)
    return checks


def a_config(a: dict) -> str:
    """How (a) was measured: its best batch, and the sessions when it was several side by side.

    Results files older than the side-by-side measurement name neither ``sessions`` nor the
    configurations: one default session.
    """
    sessions = a.get("sessions", 1)
    where = "" if sessions == 1 else f", {sessions} sessions × 1 thread"
    return f"batch {a['best_batch_size']}{where}"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _spread(point: dict, key: str, digits: int = 1) -> str:
    """ "median (min–max)", or "void"."""
    if point["void"]:
        return "void"
    return f"{point[key]:.{digits}f} ({point[key + '_min']:.{digits}f}–{point[key + '_max']:.{digits}f})"


def ceiling_probes(results: dict) -> dict[str, list[dict]]:
    """Every ceiling measured in a round (``ceiling_rounds``), by size, each once."""
    seen: dict[tuple[str, int], list[dict]] = {}
    for point in results["http"]:
        if "ceiling_rounds" in point:
            seen[(point["size"], point["concurrency"])] = point["ceiling_rounds"]
    by_size: dict[str, list[dict]] = {}
    for (size, _), probes in seen.items():
        by_size.setdefault(size, []).extend(probes)
    return by_size


def _probes_valid(results: dict) -> str:
    """ " and K of N round ceilings", or "" when no ceiling was measured in the rounds."""
    probes = [p for ps in ceiling_probes(results).values() for p in ps]
    if not probes:
        return ""
    return f" and {sum(not p['void'] for p in probes)} of {len(probes)} round ceilings"


def _probe_spread(probes: list[dict] | None) -> str:
    """ "median (min–max) of N", "void" when any was, "—" when none was measured."""
    if not probes:
        return "—"
    if any(p["void"] for p in probes):
        return "void"
    values = [p["images_per_s"] for p in probes]
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f}) of {len(values)}"


def _http_table(points: list[dict], ratio_of: dict, order: list[str], with_ceiling: bool) -> list[str]:
    head = "| server | size | c | req/s, median (min–max) | p50 ms | p99 ms | errors |"
    head += " × ceiling |" if with_ceiling else ""
    head += " foreign load, cores (max) | valid rounds |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in sorted(points, key=lambda r: (r["size"] != "640x480", order.index(r["server"]), r["concurrency"])):
        row = f"| {r['label']} | {r['size']} | {r['concurrency']} | {_spread(r, 'throughput')} | "
        row += f"{_spread(r, 'p50_ms')} | {_spread(r, 'p99_ms')} | {r['errors']} |"
        if with_ceiling:
            probe_void = any(c["void"] for c in r.get("ceiling_rounds", []))
            ratio = ratio_of[(r["server"], r["size"], r["concurrency"])]["vs_ceiling"]
            row += " void |" if probe_void else f" {_fmt(ratio, 2)} |"
        row += f" {r['foreign_cores_max']:.2f} | {r['rounds_valid']}/{r['rounds']} |"
        lines.append(row)
    return lines


def markdown(results: dict, path: Path | str) -> str:
    """The performance page's tables for one results file; void points say "void", never a number."""
    m, p = results["machine"], results["protocol"]
    everything = results["http"] + [r for t in results.get("trained", []) for r in t["http"]]
    void = [r for r in everything if r["void"]]
    lines = [
        f"Results: `{path}` ({results['started']} to {results.get('finished', '?')}), `{results['command']}`.",
        f"Machine: {m['cpu']}, {m['cores']} usable cores ({m.get('cpus', '')}), {m['memory_gib']} GiB; "
        f"onnxruntime {m['versions']['onnxruntime']}, litserve {m['versions']['litserve']}, {m['wrk']}.",
        f"Model: {results['model']['name']}: {results['model']['manifest']}. {p.get('rounds', 1)} interleaved "
        f"rounds{', the order turned by one place each round' if p.get('order') == 'turned' else ''}, "
        f"{p['seconds']:.0f} s per point after {p['warmup']:.0f} s of warm-up; medians (min–max) over rounds.",
        f"Quiet: {len(everything) - len(void)} of {len(everything)} points{_probes_valid(results)} valid; a point "
        f"is void when processes outside the benchmark took more than {p.get('void_threshold_cores', 0.1):.2f} "
        "cores while it ran (measured from /proc, re-run once).",
        "",
        "| size | (a) ORT best batch, img/s | (b) decode + ORT, 1 thread | decode CPU ms | HTTP CPU ms "
        "| ceiling, img/s | ceiling in the rounds, img/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    probes = ceiling_probes(results)
    for size, r in results["raw"].items():
        limit = results.get("ceiling", {}).get(size, {})
        if r.get("void"):
            lines.append(f"| {size} | void | void | | | void | {_probe_spread(probes.get(size))} |")
            continue
        lines.append(
            f"| {size} | {r['a']['images_per_s']:.1f} ({a_config(r['a'])}) | "
            f"{r['b_sequential']['images_per_s']:.1f} | {_fmt(limit.get('decode_cpu_ms'), 2)} | "
            f"{_fmt(limit.get('http_cpu_ms'), 2)} | "
            f"{'void' if limit.get('void', True) else _fmt(limit['images_per_s'])} | "
            f"{_probe_spread(probes.get(size))} |"
        )
    if probes:
        lines += [
            "",
            "The ceiling's columns before the last were measured once, at the start of the run. The last gives the "
            "ceiling measured again in every round of every point, just before the servers (`bench/ceiling.py`): "
            "median (min–max) over them, and each server's × ceiling below is the median over rounds of its "
            "throughput over its own round's ceiling.",
        ]
    lines.append("")
    ratio_of = {(r["server"], r["size"], r["concurrency"]): r for r in results["ratios"]}
    lines += _http_table(results["http"], ratio_of, list(results["servers"]), with_ceiling=True)
    lines += ["", "| target | measured | bound | met |", "| --- | --- | --- | --- |"]
    for t in results["targets"]:
        bound = ("≥ " if t["at_least"] else "≤ ") + f"{t['bound']:.2f}"
        met = {True: "yes", False: "**no**", None: "void or not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'], 2)} | {bound} | {met} |")
    for trained in results.get("trained", []):
        raw = trained["raw"]
        head = "void" if raw.get("void") else (
            f"(a) {raw['a']['images_per_s']:.0f} img/s ({a_config(raw['a'])}), "
            f"(b) {raw['b_sequential']['images_per_s']:.0f} img/s"
        )  # fmt: skip
        lines += ["", f"Trained model `{trained['model']}`, {trained['size']} JPEGs: {head}.", ""]
        order = list(dict.fromkeys(r["server"] for r in trained["http"]))
        lines += _http_table(trained["http"], {}, order, with_ceiling=False)
    tuned = results.get("autotune", {})
    if tuned:
        lines += ["", "| auto-tuned model | threads | chosen | measured curve (img/s) |", "| --- | --- | --- | --- |"]
        for model, described in tuned.items():
            tuning, threads = described.get("autotune", {}), described.get("threads") or {}
            chosen = tuning.get("chosen")
            curve = ", ".join(
                f"n{q['instances']} b{q['batch_size']} {q['images_per_s']:.0f}" for q in tuning.get("curve", [])
            )
            what = (
                f"{chosen['instances']} instance(s), max_batch_size {chosen['max_batch_size']}"
                if chosen
                else tuning.get("source", "")
            )
            lines.append(f"| {model} | {threads.get('reason', '')} | {what} | {curve} |")  # fmt: skip
    return "\n".join(lines)


def write_docs(text: str, docs: Path) -> None:
    """Replace what lies between the page's ``BEGIN`` and ``END`` markers with ``text``.

    Raises:
        ValueError: the page has no such markers.
    """
    page = docs.read_text()
    if BEGIN not in page or END not in page:
        raise ValueError(f"{docs} has no {BEGIN} … {END} markers to write between")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    docs.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--docs", type=Path, help="write the tables into this page (between its markers)")
    args = parser.parse_args(argv)
    text = markdown(json.loads(args.results.read_text()), args.results)
    if args.docs:
        write_docs(text, args.docs)
    print(text)


if __name__ == "__main__":
    main()
