"""The GPU benchmark: (a), (c) and (d) for each model given, on the CUDA execution provider.

    bench/gpu.sh [<repository>/<name>/<version> ...]        # sets up onnxruntime-gpu, then runs this
    python -m bench.gpu bench/.work/gpu/model_repository/vit-b16-random/1 --device cuda

For each model version folder: (a) ONNX Runtime on pre-decoded tensors at each batch size on
the device (plain ``run`` and through an IO binding; the best is the ceiling); (c) patchserve
at each concurrency with the GPU settings below; (d) patchserve with max_batch_size 1. JPEG
decoding stays on the CPU (the decode pool). Classifiers are posted to ``classify``,
detectors to ``detect``. ``--device cpu`` runs the same protocol on the CPU provider, to try
the script where there is no GPU.

patchserve's GPU settings: ``max_batch_size`` 32, ``max_queue_delay`` 2 ms, 2 instances
(two sessions, so one batch is copied while another computes), IO binding on, one decode
thread per core.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import subprocess
from pathlib import Path

from bench import images, loadgen, raw, servers
from bench.run import machine
from service.manifest import load_manifest

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
    manifest = load_manifest(model_dir / "model.json")
    name, repository = model_dir.parent.name, model_dir.parent.parent
    log.info("%s (%s): (a) on %s", name, manifest.task, args.device)
    a = {
        "plain": raw.ort_best_batch(
            model_dir, files, seconds=args.raw_seconds, batch_sizes=GPU_BATCH_SIZES, device=args.device
        ),
        "io_binding": raw.ort_best_batch(
            model_dir, files, seconds=args.raw_seconds, batch_sizes=GPU_BATCH_SIZES, device=args.device, io_binding=True
        ),
    }
    gpu_settings = {
        "device": args.device,
        "max_batch_size": "32",
        "max_queue_delay": "0.002",
        "instances": "2",
        "io_binding": "true",
    }
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
                loadgen.run(url, files, concurrency=concurrency, seconds=args.warmup)
                result = loadgen.run(url, files, concurrency=concurrency, seconds=args.seconds)
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
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16, 64, 128])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    started = dt.datetime.now(dt.UTC)
    info = machine() | {"gpu": gpu_name()}
    files = images.prepare(args.work / "images")[args.size]
    results = {
        "command": "bench/gpu.sh",
        "started": started.isoformat(timespec="seconds"),
        "device": args.device,
        "machine": info,
        "protocol": {
            "size": args.size,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
        },
        "models": [bench_model(model_dir, files, args) for model_dir in args.models],
    }
    results["machine"]["load_average_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu-{started:%Y-%m-%d}-{info['host']}-{args.device}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
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
