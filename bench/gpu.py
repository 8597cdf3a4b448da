"""The GPU benchmark: (a), (c) and (d) for each model given, on the CUDA execution provider.

    bench/gpu.sh [<repository>/<name>/<version> ...]        # sets up onnxruntime-gpu, then runs this
    python -m bench.gpu bench/.work/gpu/model_repository/vit-b16-random/1 --device cuda
    bash bench/gpu_kit/run.sh                               # on the GPU machine, offline (docs/gpu.md)

For each model version folder: (a) ONNX Runtime on pre-decoded tensors at each batch size on
the device (plain ``run`` and through an IO binding; the best is the ceiling); (c) patchserve
at each concurrency with the GPU settings below; (d) patchserve with max_batch_size 1. JPEG
decoding stays on the CPU (the decode pool). Classifiers are posted to ``classify``,
detectors to ``detect``. ``--device cpu`` runs the same protocol on the CPU provider, to try
the script where there is no GPU. ``--loadgen python`` drives the servers with
``bench/pyloadgen.py`` (asyncio, several processes) instead of wrk, where wrk cannot be
installed (the GPU machine has no apt); ``--images`` takes a folder of JPEGs instead of
writing them from ``../shared`` (which the GPU machine does not have). The results file is
rewritten after each model, so a run cut short keeps what it measured.

patchserve's GPU settings: ``max_batch_size`` 32, ``max_queue_delay`` 2 ms, 2 instances
(two sessions, so one batch is copied while another computes), IO binding on, one decode
thread per core; for detectors cuDNN's algorithm search is ``HEURISTIC`` (``EXHAUSTIVE``
benchmarks every algorithm once per input shape, and every batch size is a new shape).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import subprocess
from pathlib import Path

from bench import images, loadgen, pyloadgen, raw, servers
from bench.run import machine
from service.runtime.manifest import load_manifest
from service.tasks import detection

log = logging.getLogger("bench.gpu")

GPU_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def gpu_name() -> str | None:
    """``nvidia-smi``'s name and memory of the first GPU, or None without one."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip().splitlines()[0]


def bench_model(model_dir: Path, files: list[Path], args: argparse.Namespace) -> dict:
    """(a), (c) and (d) for one model version folder; the model's entry of the results file."""
    manifest = load_manifest(model_dir / "model.json")
    name, repository = model_dir.parent.name, model_dir.parent.parent
    search = "HEURISTIC" if manifest.task == detection.TASK.name else "EXHAUSTIVE"
    log.info("%s (%s): (a) on %s", name, manifest.task, args.device)
    a = {
        key: raw.ort_best_batch(
            model_dir,
            files,
            seconds=args.raw_seconds,
            batch_sizes=args.batch_sizes,
            device=args.device,
            io_binding=key == "io_binding",
            cudnn_conv_algo_search=search,
        )
        for key in ("plain", "io_binding")
    }
    gpu_settings = {
        "device": args.device,
        "max_batch_size": "32",
        "max_queue_delay": "0.002",
        "instances": "2",
        "io_binding": "true",
        "cudnn_conv_algo_search": search,
    }
    generator = pyloadgen if args.loadgen == "python" else loadgen
    contestants = [
        servers.patchserve(repository, name, task=manifest.task, **gpu_settings),
        servers.patchserve(
            repository,
            name,
            task=manifest.task,
            key="patchserve-no-batching",
            label="(d) patchserve, max_batch_size 1",
            **(gpu_settings | {"max_batch_size": "1", "instances": "1"}),
        ),
    ]
    http = []
    with servers.all_running(contestants, args.work / "logs" / "gpu" / name) as running:
        for concurrency in args.concurrency:
            for server in contestants:
                url = running[server.key].url + server.path
                generator.run(url, files, concurrency=concurrency, seconds=args.warmup)
                result = generator.run(url, files, concurrency=concurrency, seconds=args.seconds)
                log.info(
                    "%s %s c=%d: %.1f req/s, p99 %.1f ms",
                    name,
                    server.key,
                    concurrency,
                    result.throughput,
                    result.p99_ms,
                )
                ceiling = max(a["plain"]["images_per_s"], a["io_binding"]["images_per_s"])
                http.append(
                    {
                        "server": server.key,
                        "label": server.label,
                        **result.to_dict(),
                        "vs_a": result.throughput / ceiling,
                    }
                )
    return {
        "model": name,
        "task": manifest.task,
        "description": manifest.description,
        "a": a,
        "http": http,
        "settings": gpu_settings,
    }


def _ints(text: str) -> list[int]:
    return [int(value) for value in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", type=Path, nargs="+", help="<repository>/<name>/<version> folders")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--work", type=Path, default=Path("bench/.work"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--size", default="640x480", choices=list(images.SIZES))
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64, 128])
    parser.add_argument("--batch-sizes", type=_ints, default=list(GPU_BATCH_SIZES), help="(a)'s, e.g. 1,4,16,64")
    parser.add_argument("--loadgen", choices=["wrk", "python"], default="wrk", help="python: bench/pyloadgen.py")
    parser.add_argument("--images", type=Path, help="a folder of JPEGs to post (default: bench.images at --size)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    started = dt.datetime.now(dt.UTC)
    info = machine() | {"gpu": gpu_name()}
    files = sorted(args.images.glob("*.jpg")) if args.images else images.prepare(args.work / "images")[args.size]
    results = {
        "command": "bench/gpu.sh" if args.loadgen == "wrk" else "bench/gpu_kit/run.sh",
        "started": started.isoformat(timespec="seconds"),
        "device": args.device,
        "machine": info,
        "protocol": {
            "size": args.size,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "batch_sizes": args.batch_sizes,
            "images": len(files),
            "load_generator": (
                info["wrk"] if args.loadgen == "wrk" else "bench/pyloadgen.py (asyncio, closed loop, several processes)"
            ),
        },
        "models": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu-{started:%Y-%m-%d}-{info['host']}-{args.device}.json"
    for model_dir in args.models:
        results["models"].append(bench_model(model_dir, files, args))
        results["machine"]["load_average_end"] = os.getloadavg()
        path.write_text(json.dumps(results, indent=2) + "\n")  # after each model: a cut-short run keeps them
    for model in results["models"]:
        a = model["a"]
        print(
            f"{model['model']}: (a) {a['plain']['images_per_s']:.1f} img/s at batch {a['plain']['best_batch_size']}"
            f" ({a['plain']['provider']}), IO binding {a['io_binding']['images_per_s']:.1f}"
        )
        for r in model["http"]:
            print(
                f"  {r['label']:<34s} c={r['concurrency']:<4d} {r['throughput']:8.1f} req/s  p50 {r['p50_ms']:7.1f}"
                f"  p99 {r['p99_ms']:7.1f} ms  x(a) {r['vs_a']:.2f}  errors {r['errors']}"
            )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
