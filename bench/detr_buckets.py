"""Padding buckets vs exact-shape batching for a DETR at photo sizes (issue 18): throughput, latency, batch sizes.

    .venv/bin/python -m bench.detr_buckets --out bench/.work/detr-buckets     # or: make bench-detr-buckets

Builds (once, cached under ``--out``) the random-weight ``detr-resnet-50`` checkpoint
(:mod:`export.hf_presets`) and its import (``python -m export hf``: at shortest_edge 800 /
longest_edge 1333 the graph takes a ``pixel_mask`` and the manifest lists
``export.hf.default_buckets``). Two model repositories then hold the same ``model.onnx``:

* **buckets**: the manifest as imported; each image is padded to the first bucket that holds it,
  and images of one bucket share a batch (``service/imaging/spec.py``);
* **exact**: the same manifest without ``preprocessing.buckets``, which the server accepts for a
  ``pixel_mask`` graph: every image runs at its own resized shape with a mask of ones, and only
  images of identical shape share a batch (``service/batching/queue.py``, ``Request.key``).

Both servers run (``.venv-serve``, ``python -m service``, auto-tuner off, a fixed
``max_batch_size``, ``max_queue_delay`` and instance count; on the CPU no wide session, with
``--device cuda`` bench.gpu's detector settings), each paused (SIGSTOP) while the other is
measured. The load is a fixed stream of the benchmark photos (``bench.images.PHOTOS``; ``--photos``:
a folder of JPEGs) centre-cropped to five aspect ratios (long side 640, JPEG quality 90),
in a seeded order, posted one image per request by ``--concurrency`` closed-loop clients. Rounds
are interleaved (buckets, exact, buckets, exact, ...); each is watched (:class:`bench.quiet.Watch`)
and one during which other processes took CPU is reported LOADED, never as clean.

Per configuration: images per second, p50 and p99 request latency (medians over rounds with their
min-max), the batches formed (``patchserve_batch_size`` from ``/metrics``, before and after each
round: mean batch size and the share of batches larger than 1), the padded share of bucket pixels
(``patchserve_padding_fraction``), the time from start to ready and the warm-up's own time. Writes
``results.json`` and ``table.md`` under ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image, ImageOps

from bench import servers
from bench.images import PHOTOS, SHARED
from bench.quiet import Watch, void_reason
from bench.scrape import batch_stats, histogram
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from service.tasks import detection

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
SERVE_PYTHON = ROOT / ".venv-serve" / "bin" / "python"
ASPECTS: dict[str, tuple[int, int]] = {"4:3": (4, 3), "3:4": (3, 4), "1:1": (1, 1), "16:9": (16, 9), "5:4": (5, 4)}
LONG_SIDE = 640  # pixels: the longer side of every posted JPEG
QUALITY = 90
CONFIGS = ("buckets", "exact")


def aspect_size(ratio: tuple[int, int], long_side: int = LONG_SIDE) -> tuple[int, int]:
    """(width, height) in pixels of an image of ``ratio`` (width, height) whose longer side is ``long_side``."""
    w, h = ratio
    if w >= h:
        return long_side, round(long_side * h / w)
    return round(long_side * w / h), long_side


def stream(count: int, photos: int, aspects: list[str], seed: int = 0) -> list[tuple[int, str]]:
    """The requests' (photo index, aspect name), ``count`` of them: every pair once in a seeded order, repeated.

    Each block of ``photos * len(aspects)`` requests holds every pair exactly once, so any prefix of
    whole blocks posts each aspect ratio equally often; the order within a block is shuffled so that
    neighbouring requests (the ones that may share a batch) are not arranged by shape.
    """
    pairs = [(p, a) for p in range(photos) for a in aspects]
    rng = random.Random(seed)
    out: list[tuple[int, str]] = []
    while len(out) < count:
        block = pairs[:]
        rng.shuffle(block)
        out.extend(block)
    return out[:count]


def encode(photo: Image.Image, size: tuple[int, int]) -> bytes:
    """``photo`` centre-cropped and resized to ``size`` (W, H), Lanczos, as a baseline JPEG of quality 90."""
    buffer = io.BytesIO()
    ImageOps.fit(photo, size, Image.Resampling.LANCZOS).save(buffer, "JPEG", quality=QUALITY)
    return buffer.getvalue()


def photo_files(folder: Path | None = None) -> list[Path]:
    """The benchmark photos (``bench.images.PHOTOS`` in ../shared/images), or every JPEG of ``folder``, sorted."""
    if folder is not None:
        return sorted(folder.glob("*.jpg"))
    return [SHARED / "images" / name for name in PHOTOS]


def payloads(files: list[Path], aspects: list[str]) -> dict[tuple[int, str], bytes]:
    """Every photo of ``files`` (EXIF-upright RGB) at every aspect ratio, as JPEG bytes, by (index, aspect)."""
    out = {}
    for index, path in enumerate(files):
        with Image.open(path) as image:
            photo = ImageOps.exif_transpose(image).convert("RGB")
        for aspect in aspects:
            out[index, aspect] = encode(photo, aspect_size(ASPECTS[aspect]))
    return out


def shapes(spec: Preprocessing, aspects: list[str]) -> dict[str, dict[str, Any]]:
    """Per aspect ratio: the posted size (W, H), the model input (H, W) it resizes to and its bucket (H, W; None)."""
    preprocess = Preprocessor(spec)
    out = {}
    for aspect in aspects:
        size = aspect_size(ASPECTS[aspect])
        x = preprocess(Image.new(spec.color_mode, size))  # (C, H, W)
        out[aspect] = {"size": list(size), "input": list(x.shape[1:]), "bucket": spec.bucket_for(*x.shape[1:])}
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of one figure over rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's figures over its rounds: each round's throughput and latencies, batches summed."""
    batches = sum(r["batches"]["batches"] for r in rounds)
    images = sum(r["batches"]["images"] for r in rounds)
    singles = sum(r["batches"]["singles"] for r in rounds)
    padded = [r["batches"]["padding"] for r in rounds if r["batches"]["padding"] is not None]
    return {
        "images_per_second": spread([r["images_per_second"] for r in rounds]),
        "p50_ms": spread([r["p50_ms"] for r in rounds]),
        "p99_ms": spread([r["p99_ms"] for r in rounds]),
        "batches": batches,
        "mean_batch": images / batches if batches else None,
        "share_over_1": (batches - singles) / batches if batches else None,
        "padding": statistics.mean(padded) if padded else None,
        "loaded_rounds": [r["loaded"] for r in rounds if r["loaded"]],
    }


def _cell(figure: dict[str, float], digits: int) -> str:
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}–{figure['max']:.{digits}f})"


def table(results: dict[str, Any]) -> str:
    """The Markdown table of docs/detector-batching.md: one row per configuration."""
    lines = [
        "| batching | img/s | p50 ms | p99 ms | mean batch | batches > 1 | padding | ready s (warm-up s) | machine |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key in CONFIGS:
        c = results["configs"][key]
        s = c["summary"]
        rounds = len(c["rounds"])
        machine = f"LOADED ({len(s['loaded_rounds'])} of {rounds} rounds)" if s["loaded_rounds"] else "quiet"
        padding = "–" if s["padding"] is None else f"{100 * s['padding']:.0f} %"
        mean = "–" if s["mean_batch"] is None else f"{s['mean_batch']:.2f}"
        over = "–" if s["share_over_1"] is None else f"{100 * s['share_over_1']:.0f} %"
        warm = "?" if c["warm_up_seconds"] is None else f"{c['warm_up_seconds']:.0f}"
        lines.append(
            f"| {key} ({c['shapes']} shapes) | {_cell(s['images_per_second'], 2)} | {_cell(s['p50_ms'], 0)} | "
            f"{_cell(s['p99_ms'], 0)} | {mean} | {over} | {padding} | {c['ready_seconds']:.0f} ({warm}) | {machine} |"
        )
    return "\n".join(lines)


def prepare(work: Path, preset: str, shortest: int | None, longest: int | None) -> tuple[Path, Path, float | None]:
    """The two repositories (buckets, exact) of one import of ``preset``, built once under ``work``.

    Returns:
        (buckets repository, exact repository, seconds the import took; None when it was cached).
    """
    from export.hf import export_hf
    from export.hf_presets import PRESETS, build
    from export.onnx_export import DEFAULT_OPSET

    folder = work / "checkpoints" / preset
    if not (folder / "preprocessor_config.json").exists():  # build() writes it last
        build(preset, folder)
    processor = PRESETS[preset][1]  # the preset's own, not the file an earlier override rewrote
    own = processor["size"]
    size = {"shortest_edge": shortest or own["shortest_edge"], "longest_edge": longest or own["longest_edge"]}
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, "size": size}, indent=2))
    tag = f"{preset}-{size['shortest_edge']}x{size['longest_edge']}"
    imported = work / "imports" / tag / "1"
    export_seconds = None
    if not (imported / "model.json").exists():
        started = time.perf_counter()
        export_hf(folder, imported, opset=DEFAULT_OPSET)
        export_seconds = time.perf_counter() - started
    manifest = json.loads((imported / "model.json").read_text())
    if not manifest["preprocessing"].get("buckets"):
        raise SystemExit(f"{imported}/model.json has no preprocessing.buckets: nothing to compare")
    repositories = []
    for key in CONFIGS:
        version = work / "repositories" / tag / key / preset / "1"
        version.mkdir(parents=True, exist_ok=True)
        onnx = version / "model.onnx"
        if onnx.exists() and not onnx.samefile(imported / "model.onnx"):  # from an earlier import
            onnx.unlink()
        if not onnx.exists():
            os.link(imported / "model.onnx", onnx)  # the same graph, byte for byte, without a second copy
        if key == "exact":
            manifest["preprocessing"].pop("buckets")
        (version / "model.json").write_text(json.dumps(manifest, indent=2) + "\n")
        repositories.append(version.parents[1])
    from service.runtime.manifest import load_manifest

    load_manifest(repositories[1] / preset / "1" / "model.json")  # the server's own check of the bucket-less one
    return repositories[0], repositories[1], export_seconds


async def _post_all(url: str, route: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    """Post ``bodies`` one image per request from ``concurrency`` closed-loop clients, in order.

    Returns:
        (wall seconds for all of them, each request's latency in milliseconds).
    """
    queue = list(reversed(bodies))
    latencies: list[float] = []

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            body = queue.pop()
            start = time.perf_counter()
            response = await http.post(route, files={"image": ("photo.jpg", body, "image/jpeg")})
            response.raise_for_status()
            latencies.append((time.perf_counter() - start) * 1000)

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return time.perf_counter() - start, latencies


def measure_round(running: servers.Running, model: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    """One watched round: the stream posted once; throughput, latency percentiles and the batches formed."""
    before = httpx.get(running.url + "/metrics", timeout=30).text
    with Watch() as watch:
        seconds, latencies = asyncio.run(_post_all(running.url, running.server.path, bodies, concurrency))
    after = httpx.get(running.url + "/metrics", timeout=30).text
    assert watch.load is not None
    delta = {
        name: histogram(after, name, model).minus(histogram(before, name, model))
        for name in ("patchserve_batch_size", "patchserve_padding_fraction")
    }
    return {
        "seconds": seconds,
        "images_per_second": len(bodies) / seconds,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "batches": batch_stats(delta["patchserve_batch_size"], delta["patchserve_padding_fraction"]),
        "load": watch.load.to_dict(),
        "loaded": void_reason(watch.load),
    }


def distinct_shapes(geometry: dict[str, dict[str, Any]], key: str) -> int:
    """How many batch shapes the aspect ratios of :func:`shapes` make: buckets, or exact input shapes."""
    return len({tuple(g["bucket"] if key == "buckets" else g["input"]) for g in geometry.values()})


def start_all(
    contestants: list[servers.Server], work: Path, timeout: float
) -> tuple[dict[str, servers.Running], dict[str, float]]:
    """Start each server in turn, the others paused while it warms up.

    Returns:
        (the running servers by key, seconds from each one's start to ``/readyz`` 200, by key).
    """
    running: dict[str, servers.Running] = {}
    ready: dict[str, float] = {}
    try:
        for server in contestants:
            with contextlib.ExitStack() as paused:
                for other in running.values():
                    other.pause()
                    paused.callback(other.resume)
                started = time.perf_counter()
                running[server.key] = servers.start(server, work / "logs", timeout=timeout)
                ready[server.key] = time.perf_counter() - started
    except BaseException:
        for live in running.values():
            live.stop()
        raise
    return running, ready


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare, serve both configurations and measure them in interleaved rounds; the results document."""
    buckets_repo, exact_repo, export_seconds = prepare(args.out, args.preset, args.shortest_edge, args.longest_edge)
    manifest = json.loads((buckets_repo / args.preset / "1" / "model.json").read_text())
    aspects = list(ASPECTS)
    geometry = shapes(Preprocessing.model_validate(manifest["preprocessing"]), aspects)
    files = photo_files(args.photos)
    encoded = payloads(files, aspects)
    bodies = [encoded[pair] for pair in stream(args.requests, len(files), aspects, seed=args.seed)]
    settings = {
        "auto_tune": "false",
        "max_batch_size": str(args.max_batch_size),
        "max_queue_delay": str(args.max_queue_delay),
        "instances": str(args.instances),
        "drain_delay": "0",
        "device": args.device,
    }
    if args.device == "cpu":
        settings["wide_session"] = "false"  # every batch on the one session measured
    else:  # bench.gpu's detector settings: EXHAUSTIVE would search cuDNN's algorithms once per new shape
        settings |= {"io_binding": "true", "cudnn_conv_algo_search": "HEURISTIC"}
    contestants = [
        dataclasses.replace(
            servers.patchserve(repository, args.preset, task=detection.TASK.name, key=key, **settings),
            argv=(str(args.serve_python), "-m", "service"),
        )
        for key, repository in zip(CONFIGS, (buckets_repo, exact_repo), strict=True)
    ]
    configs: dict[str, dict[str, Any]] = {}
    running, ready = start_all(contestants, args.out, args.ready_timeout)
    try:
        for key, live in running.items():
            version = httpx.get(live.url + "/v1/models", timeout=30).json()["models"][0]["versions"][0]
            configs[key] = {
                "ready_seconds": ready[key],
                "warm_up_seconds": version["warm_up_seconds"],
                "shapes": distinct_shapes(geometry, key),
                "rounds": [],
            }
        for key in CONFIGS:  # every aspect once, alone: a shape the warm-up did not run pays its first run here
            with servers.alone(running, key) as live:
                asyncio.run(_post_all(live.url, live.server.path, [encoded[0, a] for a in aspects], 1))
        for index in range(args.rounds):
            for key in CONFIGS:
                with servers.alone(running, key) as live:
                    figures = measure_round(live, args.preset, bodies, args.concurrency)
                configs[key]["rounds"].append(figures)
                log.info(
                    "round %d %s: %.2f img/s, p50 %.0f ms, p99 %.0f ms, mean batch %s%s",
                    index + 1, key, figures["images_per_second"], figures["p50_ms"], figures["p99_ms"],
                    figures["batches"]["mean_batch"], f"; LOADED: {figures['loaded']}" if figures["loaded"] else "",
                )  # fmt: skip
    finally:
        for live in running.values():
            live.stop()
    for config in configs.values():
        config["summary"] = summary(config["rounds"])
    return {
        "preset": args.preset,
        "preprocessing": {k: manifest["preprocessing"][k] for k in ("shortest_edge", "longest_edge", "buckets")},
        "aspects": geometry,
        "photos": [p.name for p in files],
        "requests": args.requests,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "settings": settings,
        "export_seconds": export_seconds,
        "cpu_count": os.cpu_count(),
        "configs": configs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.detr_buckets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / ".work" / "detr-buckets")
    parser.add_argument("--preset", default="detr-resnet-50", help="an export.hf_presets DETR (tiny-detr: a smoke run)")
    parser.add_argument("--shortest-edge", type=int, help="override the preset's processor (default: its own, 800)")
    parser.add_argument("--longest-edge", type=int, help="override the preset's processor (default: its own, 1333)")
    parser.add_argument(
        "--requests", type=int, default=50, help="images per round, one per request (25: each pair once)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration, interleaved")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--max-queue-delay", type=float, default=0.05, help="seconds")
    parser.add_argument("--instances", type=int, default=1, help="ONNX Runtime sessions per server")
    parser.add_argument("--seed", type=int, default=0, help="the stream's order")
    parser.add_argument("--ready-timeout", type=float, default=1800, help="seconds a server may take to warm up")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--photos", type=Path, help="a folder of JPEGs instead of ../shared/images (a GPU machine)")
    parser.add_argument("--serve-python", type=Path, default=SERVE_PYTHON, help="the server's interpreter (no torch)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    if not args.serve_python.exists():
        raise SystemExit(
            f"{args.serve_python} is missing: run `make .venv-serve/.installed-cpu` or pass --serve-python"
        )
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2: the configurations are compared in interleaved rounds")
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args)
    text = table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "table.md").write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
