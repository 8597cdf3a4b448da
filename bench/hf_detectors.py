"""One end-to-end run per DETR-family preset: build the random-weight checkpoint, import it, serve it, time it.

    .venv/bin/python -m bench.hf_detectors rtdetr-r50vd yolos-tiny --out bench/.work/hf-detectors

For each preset (:mod:`export.hf_detector_presets`): builds the ``save_pretrained`` folder offline, runs
``python -m export hf`` on it (timed), starts the real server (``.venv-serve``, ``python -m service``,
CPU, auto-tuner off, ``max_batch_size`` 4) on that one model, posts the benchmark photos (the five of
``bench.images``, re-encoded as 640x480 JPEGs at quality 90 as it does) and measures milliseconds per
image at batch 1 (one image per request, one request at a time) and batch 4 (four images in one
multipart request, one batch), in interleaved rounds; medians with their range.

Every round is watched (:class:`bench.quiet.Watch`): a round during which other processes took more
than ``bench.quiet.THRESHOLD`` cores is marked *loaded* (:func:`bench.quiet.void_reason`) and the
figures of a preset with any loaded round are reported as taken on a loaded machine, never as clean.
Writes ``results.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from PIL import Image, ImageOps

from bench.images import PHOTOS, SHARED
from bench.quiet import Watch, void_reason

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
SERVE_PYTHON = ROOT / ".venv-serve" / "bin" / "python"


def photos() -> list[bytes]:
    """The benchmark photos as 640x480 baseline JPEGs, quality 90 (bench.images' recipe)."""
    payloads = []
    for name in PHOTOS:
        image = ImageOps.exif_transpose(Image.open(SHARED / "images" / name)).convert("RGB")
        buffer = io.BytesIO()
        ImageOps.fit(image, (640, 480), Image.Resampling.LANCZOS).save(buffer, "JPEG", quality=90)
        payloads.append(buffer.getvalue())
    return payloads


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(repository: Path) -> tuple[str, subprocess.Popen]:
    """The real server on ``repository``, ready; returns (base URL, process)."""
    port = free_port()
    env = {
        **os.environ,
        "PATCHSERVE_HOST": "127.0.0.1",
        "PATCHSERVE_PORT": str(port),
        "PATCHSERVE_MODEL_REPOSITORY": str(repository),
        "PATCHSERVE_DEVICE": "cpu",
        "PATCHSERVE_AUTO_TUNE": "false",
        "PATCHSERVE_MAX_BATCH_SIZE": "4",
        "PATCHSERVE_DRAIN_DELAY": "0",
    }
    process = subprocess.Popen([str(SERVE_PYTHON), "-m", "service"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError("server not ready in 600 s")


def one_round(client: httpx.Client, route: str, payloads: list[bytes], batch: int) -> float:
    """Milliseconds per image: ``payloads`` one per request (batch 1) or the first 4 in one request."""
    start = time.perf_counter()
    if batch == 1:
        for payload in payloads:
            client.post(route, files={"image": payload}).raise_for_status()
        images = len(payloads)
    else:
        files = [("image", (f"{i}.jpg", p, "image/jpeg")) for i, p in enumerate(payloads[:batch])]
        client.post(route, files=files).raise_for_status()
        images = batch
    return (time.perf_counter() - start) * 1000 / images


def run_preset(name: str, work: Path, rounds: int) -> dict:
    """Build, import, serve and time preset ``name``; the row of the results table."""
    from export.hf import export_hf
    from export.hf_presets import build
    from export.onnx_export import DEFAULT_OPSET

    repository = work / "repositories" / name  # the one model, so nothing else there stops the server
    folder, out = work / "checkpoints" / name, repository / name / "1"
    build(name, folder)
    start = time.perf_counter()
    manifest = export_hf(folder, out, opset=DEFAULT_OPSET)
    export_seconds = time.perf_counter() - start
    payloads = photos()
    url, process = serve(repository)
    timings: dict[int, list[float]] = {1: [], 4: []}
    loaded: list[str] = []
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            route = f"/v1/models/{name}/detect"
            detections = len(client.post(route + "?threshold=0", files={"image": payloads[0]}).json()["detections"])
            one_round(client, route, payloads, 4)  # warm-up at both shapes of batch
            for _ in range(rounds):
                for batch in (1, 4):
                    with Watch() as watch:
                        timings[batch].append(one_round(client, route, payloads, batch))
                    reason = void_reason(watch.load)
                    if reason:
                        loaded.append(f"batch {batch}: {reason}")
    finally:
        process.terminate()
        process.wait(timeout=60)
    return {
        "preset": name,
        "architecture": manifest.description.split()[0],
        "task_options": manifest.task_options,
        "parameters_millions": float(manifest.provenance.notes.split("M parameters")[0]),
        "input": manifest.input.shape,
        "export_seconds": round(export_seconds, 1),
        "parity_max_abs_diff": manifest.provenance.export.parity_max_abs_diff,
        "detections_at_threshold_0": detections,
        "ms_per_image": {
            str(b): {"median": round(statistics.median(t), 1), "min": round(min(t), 1), "max": round(max(t), 1)}
            for b, t in timings.items()
        },
        "rounds": rounds,
        "loaded_rounds": loaded,
        "cpu_count": os.cpu_count(),
    }


def table(rows: list[dict]) -> str:
    """The Markdown table of the docs page."""
    lines = [
        "| preset | architecture | scores | params (M) | export (s) | ms/image b=1 | ms/image b=4 | machine |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        options = r["task_options"] or {}
        scores = options.get("scores", "softmax") + (f" k={options['top_k']}" if options.get("top_k") else "")
        b1, b4 = r["ms_per_image"]["1"], r["ms_per_image"]["4"]
        machine = f"LOADED ({len(r['loaded_rounds'])} of {2 * r['rounds']} rounds)" if r["loaded_rounds"] else "quiet"
        lines.append(
            f"| {r['preset']} | {r['architecture']} | {scores} | {r['parameters_millions']:.1f} | "
            f"{r['export_seconds']:.0f} | {b1['median']:.0f} ({b1['min']:.0f}-{b1['max']:.0f}) | "
            f"{b4['median']:.0f} ({b4['min']:.0f}-{b4['max']:.0f}) | {machine} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hf_detectors", description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="+", help="export.hf_presets names, e.g. rtdetr-r50vd")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / ".work" / "hf-detectors")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    rows = json.loads(results.read_text()) if results.exists() else []
    failed = []
    for name in args.presets:
        try:
            row = run_preset(name, args.out, args.rounds)
        except Exception as exc:  # one preset's failure (a refusal, a parity error) is reported, the rest run
            log.exception("%s failed", name)
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        rows = [r for r in rows if r["preset"] != name] + [row]
        results.write_text(json.dumps(rows, indent=2))
        sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.write(table(rows) + "\n" + "".join(f"FAILED {line}\n" for line in failed))


if __name__ == "__main__":
    main()
