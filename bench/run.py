"""The side-by-side benchmark: (a)-(f) on the same ONNX model and the same images, in one run.

    make bench                      # sets everything up, then runs this
    python -m bench.run --seconds 15

(a) ONNX Runtime alone on pre-decoded tensors at its best batch size (the ceiling); (b) decode,
preprocess and ORT in process, one image at a time (and with decoding over 2 threads); (c)
patchserve at concurrency 1, 4, 16, 64; (d) patchserve with max_batch_size 1; (e) a naive sync
FastAPI endpoint; (f) LitServe with batching on. The HTTP contestants run side by side (all
started, then each (size, concurrency) point measured for every server in turn), so load on
the machine that drifts during the run hits them alike. Every server is first checked to
answer the same top-1 class as ONNX Runtime in process for the same image.

Writes ``bench/results/<date>-<host>.json`` and the plots beside it, and prints the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import socket
import sys
from pathlib import Path

import httpx
import numpy as np

from bench import decode, images, loadgen, plots, raw, report, servers
from service.manifest import load_manifest
from service.tasks import classification

log = logging.getLogger("bench")

BENCH_MODEL = "vit-ti16-random"
SIZES = tuple(images.SIZES)


def machine() -> dict:
    """The machine the run is on: CPU model, cores, memory, load, versions."""
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        platform.processor(),
    )
    memory = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in ln), "0")
    versions = {}
    for package in (
        "onnxruntime",
        "onnxruntime-gpu",
        "numpy",
        "pillow",
        "fastapi",
        "uvicorn",
        "litserve",
        "orjson",
        "uvloop",
        "httptools",
    ):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "host": socket.gethostname(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "wrk": loadgen.wrk_version(),
        "versions": versions,
    }


def smoke_check(running: servers.Running, path: str, image: Path, expected_class: int) -> None:
    """One request: the server must answer 200 with the same top-1 class as ORT in process.

    Raises:
        RuntimeError: another status or another top-1 class.
    """
    response = httpx.post(
        running.url + path, files={"image": (image.name, image.read_bytes(), "image/jpeg")}, timeout=60
    )
    if response.status_code != 200:
        raise RuntimeError(f"{running.server.key}: {response.status_code} {response.text[:200]}")
    got = response.json()["predictions"][0]["class_id"]
    if got != expected_class:
        raise RuntimeError(f"{running.server.key}: top-1 class {got}, ONNX Runtime in process says {expected_class}")


def expected_top1(model_dir: Path, image: Path) -> int:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    x = raw.decode(raw.preprocessor_for(model_dir), image.read_bytes())[None]
    return int(np.argmax(session.run(None, {session.get_inputs()[0].name: x})[0][0]))


def measure_raw(model_dir: Path, files: list[Path], seconds: float) -> dict:
    log.info("raw %s on %d images: (a) best batch, (b) decode + run", model_dir.parent.name, len(files))
    return {
        "a": raw.ort_best_batch(model_dir, files, seconds=seconds),
        "b_sequential": raw.decode_and_run(model_dir, files, seconds=seconds),
        "b_threads": raw.decode_and_run(model_dir, files, seconds=seconds, decode_threads=2),
        "load_average": os.getloadavg(),
    }


def measure_http(
    contestants: list[servers.Server],
    files_by_size: dict[str, list[Path]],
    concurrencies: list[int],
    *,
    model: str,
    model_dir: Path,
    seconds: float,
    warmup: float,
    log_dir: Path,
) -> list[dict]:
    """Every (size, concurrency) point for every server in turn, all servers up at once."""
    results = []
    with servers.all_running(contestants, log_dir) as running:
        probe = files_by_size[next(iter(files_by_size))][0]
        expected = expected_top1(model_dir, probe)
        for server in contestants:
            smoke_check(running[server.key], server.path.format(model=model), probe, expected)
        for size, files in files_by_size.items():
            for concurrency in concurrencies:
                for server in contestants:
                    url = running[server.key].url + server.path.format(model=model)
                    if warmup > 0:
                        loadgen.run(url, files, concurrency=concurrency, seconds=warmup)
                    result = loadgen.run(url, files, concurrency=concurrency, seconds=seconds)
                    log.info(
                        "%-24s %-9s c=%-3d %7.2f req/s  p50 %7.1f  p90 %7.1f  p99 %7.1f ms  errors %d",
                        server.key,
                        size,
                        concurrency,
                        result.throughput,
                        result.p50_ms,
                        result.p90_ms,
                        result.p99_ms,
                        result.errors,
                    )
                    results.append(
                        {
                            "model": model,
                            "server": server.key,
                            "label": server.label,
                            "size": size,
                            **result.to_dict(),
                            "load_average": os.getloadavg(),
                        }
                    )
    return results


def trained_models(repository: Path) -> list[tuple[str, Path]]:
    """(name, version folder) of the highest version of every classification model in the repository."""
    found = []
    for name_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        versions = sorted((p for p in name_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        if versions and load_manifest(versions[-1] / "model.json").task == classification.TASK.name:
            found.append((name_dir.name, versions[-1]))
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("bench/.work"), help="images, model, logs (gitignored)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each point")
    parser.add_argument("--raw-seconds", type=float, default=5.0, help="seconds per (a)/(b) measurement")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--servers", default="patchserve,patchserve-no-batching,naive,litserve")
    parser.add_argument("--trained", default="model_repository", type=Path, help="also bench these models ('' skips)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    started = dt.datetime.now(dt.UTC)
    info = machine()
    log.info("machine: %s, %d cores, load average %s", info["cpu"], info["cores"], info["load_average"])
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    files = images.prepare(args.work / "images")
    files_by_size = {size: files[size] for size in args.sizes.split(",")}
    repository = args.work / "model_repository"
    model_dir = repository / BENCH_MODEL / "1"
    if not (model_dir / "model.onnx").is_file():
        sys.exit(f"{model_dir}/model.onnx is missing: `make bench` exports it (python -m export random vit-ti16 ...)")
    wanted = args.servers.split(",")
    contestants = [s for s in servers.contestants(repository, BENCH_MODEL) if s.key in wanted]

    results: dict = {
        "command": "make bench",
        "argv": sys.argv[1:] if argv is None else argv,
        "started": started.isoformat(timespec="seconds"),
        "machine": info,
        "protocol": {
            "seconds": args.seconds,
            "warmup": args.warmup,
            "raw_seconds": args.raw_seconds,
            "concurrency": concurrencies,
            "load_generator": f"{info['wrk']}, 1 thread, closed loop, bench/multipart.lua",
            "images": {size: [p.name for p in paths] for size, paths in files_by_size.items()},
            "image_bytes_mean": {
                size: float(np.mean([p.stat().st_size for p in paths])) for size, paths in files_by_size.items()
            },
        },
        "model": {"name": BENCH_MODEL, "manifest": load_manifest(model_dir / "model.json").description},
        "servers": {s.key: {"label": s.label, "env": dict(s.env)} for s in contestants},
        "decode": {size: decode.decode_cost(model_dir, paths) for size, paths in files_by_size.items()},
        "raw": {size: measure_raw(model_dir, paths, args.raw_seconds) for size, paths in files_by_size.items()},
    }
    results["http"] = measure_http(
        contestants,
        files_by_size,
        concurrencies,
        model=BENCH_MODEL,
        model_dir=model_dir,
        seconds=args.seconds,
        warmup=args.warmup,
        log_dir=args.work / "logs",
    )

    results["trained"] = []
    if str(args.trained) and args.trained.is_dir():
        first_size = next(iter(files_by_size))
        for name, version_dir in trained_models(args.trained):
            these = [s for s in servers.contestants(args.trained, name, version_dir.name) if s.key in wanted]
            these = [s for s in these if s.key != "patchserve-no-batching"]
            results["trained"].append(
                {
                    "model": name,
                    "size": first_size,
                    "raw": measure_raw(version_dir, files_by_size[first_size], args.raw_seconds),
                    "http": measure_http(
                        these,
                        {first_size: files_by_size[first_size]},
                        [1, 16],
                        model=name,
                        model_dir=version_dir,
                        seconds=args.seconds,
                        warmup=args.warmup,
                        log_dir=args.work / "logs" / name,
                    ),
                }
            )

    results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results["machine"]["load_average_end"] = os.getloadavg()
    results["ratios"] = report.ratios(results)
    results["targets"] = report.targets(results)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{started:%Y-%m-%d}-{info['host']}"
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    plots.plot(results, args.out / stem)
    print(report.markdown(results, path))


if __name__ == "__main__":
    main()
