"""The backbone families' table (docs/backbones.md): parameters, import time and CPU ms/image at batch 1 and 4.

    .venv/bin/python -m bench.hf_families --docs docs/backbones.md      # ~10 minutes on 2 cores

For each preset (``export.hf_presets``: a hub config with random weights, built offline) it
builds the checkpoint, imports it with ``export.hf.export_hf`` (the dynamo export and its parity
check, timed), then runs the graph in ONNX Runtime on the CPU (default session options: the
thread count ORT picks for this machine) at batch 1 and batch 4, several timed runs after a
warm-up, and reports the median milliseconds per image with the min-max. Not a test: wall-clock
numbers belong here, never in tests/.

Every measurement is watched with ``bench/quiet.py``: the CPU time processes outside this one
took while it ran. A figure taken while they took more than ``quiet.THRESHOLD`` cores is kept
but marked *loaded* (with the foreign load) in the table and the JSON, so nobody mistakes it for
a quiet-machine number (docs/STYLE.md, item 14); rerun on a quiet machine to replace it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench import quiet

DEFAULT_PRESETS = (
    "dinov2-small-imagenet1k-1-layer",
    "dinov2-with-registers-small-imagenet1k-1-layer",
    "swin-tiny-patch4-window7-224",
    "swinv2-tiny-patch4-window8-256",
    "beit-base-patch16-224",
)
MIN_SECONDS = 3.0  # the shortest watched measurement
BEGIN, END = "<!-- hf_families:begin -->", "<!-- hf_families:end -->"
log = logging.getLogger("bench.hf_families")


@dataclass
class Timing:
    """Milliseconds per image at one batch size: median and range over ``runs`` timed runs, and the load meanwhile."""

    batch: int
    runs: int
    median_ms: float
    min_ms: float
    max_ms: float
    foreign_cores: float
    loaded: str  # quiet.void_reason: "" on a quiet machine


@dataclass
class Row:
    preset: str
    architecture: str
    parameters_m: float
    input: str
    parity: dict[str, float]
    export_seconds: float
    export_foreign_cores: float
    timings: list[Timing]


def time_batches(model_path: Path, shape: tuple[int, int, int], batches: tuple[int, ...], runs: int) -> list[Timing]:
    """ORT CPU ms/image of ``model_path`` at each batch size (inputs: seeded normal noise, float32 (B, C, H, W))."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    timings = []
    for batch in batches:
        x = np.random.default_rng(0).normal(size=(batch, *shape)).astype(np.float32)
        for _ in range(2):  # warm-up
            session.run(None, {name: x})
        per_image = []
        with quiet.Watch() as watch:
            began = time.perf_counter()
            # at least `runs` runs and MIN_SECONDS: /proc counts CPU in clock ticks (10 ms), too coarse for less
            while len(per_image) < runs or time.perf_counter() - began < MIN_SECONDS:
                start = time.perf_counter()
                session.run(None, {name: x})
                per_image.append((time.perf_counter() - start) * 1000 / batch)
        assert watch.load is not None
        timings.append(
            Timing(
                batch,
                len(per_image),
                statistics.median(per_image),
                min(per_image),
                max(per_image),
                watch.load.foreign_cores,
                quiet.void_reason(watch.load),
            )
        )
    return timings


def measure(preset: str, work: Path, runs: int) -> Row:
    """Build ``preset``, import it (timed and watched), and time its graph."""
    from export.hf import export_hf
    from export.hf_presets import build

    folder = build(preset, work / "checkpoints" / preset)
    out = work / "repository" / preset / "1"
    with quiet.Watch() as watch:
        start = time.perf_counter()
        manifest = export_hf(folder, out, opset=18)
        seconds = time.perf_counter() - start
    assert watch.load is not None
    _, c, h, w = manifest.input.shape
    parameters = float(re.match(r"([\d.]+)M parameters", manifest.provenance.notes).group(1))  # type: ignore[union-attr]
    crop = manifest.preprocessing.crop_size
    size = manifest.preprocessing.size
    resized = f"{size.height}²" if size else f"short side {manifest.preprocessing.shortest_edge}"
    return Row(
        preset=preset,
        architecture=manifest.description.split()[0],
        parameters_m=parameters,
        input=f"{resized} → crop {crop.height}²" if crop else f"{h}×{w}",
        parity=manifest.provenance.export.parity_max_abs_diff,
        export_seconds=seconds,
        export_foreign_cores=watch.load.foreign_cores,
        timings=time_batches(out / "model.onnx", (int(c), int(h), int(w)), (1, 4), runs),
    )


def _cell(t: Timing) -> str:
    figure = f"{t.median_ms:.1f} ({t.min_ms:.1f}–{t.max_ms:.1f})"
    return f"{figure} *loaded: {t.foreign_cores:.2f} foreign cores*" if t.loaded else figure


def table(rows: list[Row]) -> str:
    """The docs page's markdown table."""
    lines = [
        "| preset (hub config) | architecture | parameters | input | import (s) | CPU ms/image, batch 1 | batch 4 "
        "| parity batch 1 / 4 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        export = f"{r.export_seconds:.0f}" + (
            f" *loaded: {r.export_foreign_cores:.2f} foreign cores*" if r.export_foreign_cores > quiet.THRESHOLD else ""
        )
        parity = " / ".join(f"{v:.1e}" for v in r.parity.values())
        lines.append(
            f"| `{r.preset}` | `{r.architecture}` | {r.parameters_m:.1f}M | {r.input} | {export} "
            f"| {_cell(r.timings[0])} | {_cell(r.timings[1])} | {parity} |"
        )
    return "\n".join(lines)


def write_docs(path: Path, text: str) -> None:
    """Replace the table between the BEGIN and END markers of ``path``."""
    page = path.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write the table between")
    head, rest = page.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hf_families", description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="*", default=list(DEFAULT_PRESETS))
    parser.add_argument("--work", type=Path, default=Path("bench/.work/hf_families"))
    parser.add_argument("--runs", type=int, default=10, help="timed runs per batch size")
    parser.add_argument("--results", type=Path, default=Path("bench/results"))
    parser.add_argument("--docs", type=Path, help="a page with the table markers to rewrite (docs/backbones.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    rows = []
    for preset in args.presets:
        rows.append(measure(preset, args.work, args.runs))
        log.info("%s", asdict(rows[-1]))
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    args.results.mkdir(parents=True, exist_ok=True)
    record = {
        "when_utc": stamp,
        "machine": {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)), "processor": platform.processor()},
        "threshold_cores": quiet.THRESHOLD,
        "rows": [asdict(r) for r in rows],
    }
    result = args.results / f"hf-families-{stamp}.json"
    result.write_text(json.dumps(record, indent=2) + "\n")
    text = table(rows)
    loaded = any(t.loaded for r in rows for t in r.timings)
    warning = "; figures marked *loaded* were taken while other processes ran: rerun on a quiet machine."
    note = f"\n\nMeasured {stamp} UTC on {record['machine']['cpus']} CPUs ({result.as_posix()})" + (
        warning if loaded else "."
    )
    print(text + note)
    if args.docs:
        write_docs(args.docs, text + note)


if __name__ == "__main__":
    main()
