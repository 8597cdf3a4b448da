"""The side-by-side benchmark: (a)-(f) on the same ONNX model and the same images, in one run.

    make bench                      # sets everything up, then runs this (about 35 minutes)
    python -m bench.run --seconds 10 --rounds 3 --docs docs/performance.md

(a) ONNX Runtime alone on pre-decoded tensors at its best batch size (the better of one default
session and one one-thread session per core side by side, :func:`bench.raw.ort_best`); (b) decode, preprocess
and ORT in process, one image at a time (and with decoding over 2 threads); (c) patchserve at
concurrency 1, 4, 16, 64; (d) patchserve with max_batch_size 1; (e) a naive sync FastAPI
endpoint; (f) LitServe with batching on. Every server is first checked to answer the same top-1
class as ONNX Runtime in process for the same image. patchserve runs with its shipped defaults;
its auto-tuner measures afresh (a new cache folder per run), and what it chose is recorded.

A benchmark that cannot be fooled by the machine (issue 14):

* **quiet or void**: the CPU time of every process outside the benchmark's own tree is read
  from /proc during each point's warm-up and measurement (:mod:`bench.quiet`); a point during
  which it passed 0.1 cores is re-run once and, still loaded, reported void and kept out of
  every table. (a), (b) and the HTTP-cost measurement are judged the same way.
* **interleaved rounds**: every (size, concurrency) point is measured for each contestant in
  turn, ``--rounds`` times (3), the order turned by one place each round (A B C D, B C D A,
  C D A B: :func:`schedule`), so drifting load hits them alike and no contestant always holds the
  same place in the round; tables give the median with its min-max.
* **the ceiling**: what serving encoded images could reach on these cores, from measured
  costs: 1 / (1/(a) + (decode CPU + HTTP CPU per image) / cores), the HTTP CPU from an endpoint
  that only reads the same multipart body (``bench/echo_app.py``) under the same wrk load;
  measured at the start and again in every round of every point, first in the round
  (:mod:`bench.ceiling`), and every server's round is reported as a fraction of its own
  round's ceiling (median over rounds), so a host whose cores slow down lowers both.
* the trained models in ``model_repository/`` are served one per server (as the naive endpoint
  and LitServe serve one), at concurrency 1 and 16.

Writes ``bench/results/<date>-<host>.json`` and the plots beside it, and prints the tables
(``--docs PAGE`` also writes them into that page between its markers).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import numpy as np

from bench import ceiling, decode, images, loadgen, plots, quiet, raw, report, servers
from service.runtime.cpus import usable_cpus
from service.runtime.manifest import load_manifest
from service.tasks import classification

log = logging.getLogger("bench")

BENCH_MODEL = "vit-ti16-random"
PATCHSERVE = "patchserve"
SIZES = tuple(images.SIZES)


def machine() -> dict:
    """The machine the run is on: CPU model, cores, memory, load, versions (wrk's: None without it)."""
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
    cpus = usable_cpus()
    return {
        "host": socket.gethostname(),
        "cpu": cpu,
        "cores": cpus.cores,
        "cpus": cpus.describe(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "wrk": loadgen.wrk_version() if shutil.which("wrk") else None,  # the GPU machine has none
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


def _quietly(measure: Callable[[], dict], what: str) -> dict:
    """``measure()`` under a :class:`quiet.Watch`; once more if the machine was loaded. Adds ``load``, ``void``."""
    for attempt in (1, 2):
        with quiet.Watch() as watch:
            result = measure()
        assert watch.load is not None
        result |= {"load": watch.load.to_dict(), "void": quiet.void_reason(watch.load), "attempt": attempt}
        if not result["void"]:
            break
        log.warning("%s: void (%s)%s", what, result["void"], "; once more" if attempt == 1 else "")
    return result


def measure_raw(model_dir: Path, files: list[Path], seconds: float) -> dict:
    log.info("raw %s on %d images: (a) best batch, (b) decode + run", model_dir.parent.name, len(files))

    def measure() -> dict:
        return {
            "a": raw.ort_best(model_dir, files, seconds=seconds, cores=usable_cpus().cores),
            "b_sequential": raw.decode_and_run(model_dir, files, seconds=seconds),
            "b_threads": raw.decode_and_run(model_dir, files, seconds=seconds, decode_threads=2),
        }

    return _quietly(measure, f"raw {model_dir.parent.name}")


def rotated(contestants: Sequence[str], round_: int) -> list[str]:
    """The contestants' order in round ``round_``: the list turned left by ``round_`` places.

    Over as many rounds as contestants each takes every place once (a cyclic Latin square), so a
    place's own advantage (the point just after a probe, or after a paused server resumed) is spread
    over all of them instead of always falling to the same one.
    """
    k = round_ % len(contestants) if contestants else 0
    return [*contestants[k:], *contestants[:k]]


def schedule(
    sizes: Sequence[str],
    concurrencies: Sequence[int],
    contestants: Sequence[str],
    rounds: int,
    *,
    first: Sequence[str] = (),
) -> list[tuple[str, int, int, str]]:
    """The order points are measured in: (size, concurrency, round, contestant).

    For each (size, concurrency), every contestant in turn, ``rounds`` times, in an order turned by
    one place each round (:func:`rotated`): A B C, B C A, C A B. ``first`` (the ceiling's probe) opens
    every round, before them.
    """
    return [
        (size, c, r, key)
        for size in sizes
        for c in concurrencies
        for r in range(rounds)
        for key in [*first, *rotated(contestants, r)]
    ]


def measure_point(url: str, files: list[Path], *, concurrency: int, seconds: float, warmup: float) -> dict:
    """One wrk run after a warm-up, each under a watch; re-run once when the machine was loaded.

    Returns:
        wrk's result with ``load`` (during the measurement), ``load_before`` (during the
        warm-up), ``void`` ("" or why) and ``attempt`` (1, or 2 after a void first try).
    """
    for attempt in (1, 2):
        before = None
        if warmup > 0:
            with quiet.Watch() as watch:
                loadgen.run(url, files, concurrency=concurrency, seconds=warmup)
            before = watch.load
        with quiet.Watch() as watch:
            result = loadgen.run(url, files, concurrency=concurrency, seconds=seconds)
        assert watch.load is not None
        void = quiet.void_reason(watch.load)
        point = result.to_dict() | {
            "load": watch.load.to_dict(),
            "load_before": before.to_dict() if before else None,
            "void": void,
            "attempt": attempt,
        }
        if not void:
            break
        log.warning("%s c=%d: void (%s)%s", url, concurrency, void, "; once more" if attempt == 1 else "")
    return point


def described(running: servers.Running, model: str) -> dict:
    """patchserve's ``GET /v1/models/{model}`` for its latest version: threads and the tuner's choice."""
    version = httpx.get(f"{running.url}/v1/models/{model}", timeout=10).json()["versions"][-1]
    return {key: version.get(key) for key in ("threads", "autotune", "batching", "instances")}


def measure_http(
    contestants: list[servers.Server],
    files_by_size: dict[str, list[Path]],
    concurrencies: list[int],
    *,
    model: str,
    model_dir: Path,
    seconds: float,
    warmup: float,
    rounds: int,
    log_dir: Path,
    tuned: dict | None = None,
    ceiling_probe: ceiling.Probe | None = None,
) -> list[dict]:
    """Every (size, concurrency) point for every server in interleaved rounds, all servers up at once
    and all but the one measured paused (SIGSTOP) during each point.

    With a ``ceiling_probe``, each round of each point first measures the ceiling's costs again
    (:mod:`bench.ceiling`), with its HTTP-alone endpoint the only server running.

    Returns:
        One record per (server, size, concurrency): :func:`report.summarise` of its rounds,
        the rounds themselves under ``rounds_detail``, and with a ``ceiling_probe`` the ceilings of the
        same rounds under ``ceiling_rounds``. ``tuned`` receives patchserve's choices.
    """
    measured: dict[tuple[str, str, int], list[dict]] = {}
    probed: dict[tuple[str, int], list[dict]] = {}
    everyone = contestants + ([ceiling_probe.server] if ceiling_probe is not None else [])
    with servers.all_running(everyone, log_dir) as running:
        probe = files_by_size[next(iter(files_by_size))][0]
        expected = expected_top1(model_dir, probe)
        for server in contestants:
            smoke_check(running[server.key], server.path.format(model=model), probe, expected)
            if server.key.startswith("patchserve") and tuned is not None:
                tuned[f"{model} ({server.key})"] = described(running[server.key], model)
        by_key = {server.key: server for server in contestants}
        first = [ceiling.KEY] if ceiling_probe is not None else []
        for size, concurrency, round_, key in schedule(list(files_by_size), concurrencies, list(by_key), rounds,
                                                       first=first):  # fmt: skip
            if ceiling_probe is not None and key == ceiling.KEY:
                with servers.alone(running, ceiling_probe.server.key) as echo:

                    def measure(echo: servers.Running = echo, size: str = size) -> dict:
                        return ceiling_probe(echo, size)

                    limit = _quietly(measure, f"ceiling {size} c={concurrency}") | {"round": round_}
                probed.setdefault((size, concurrency), []).append(limit)
                log.info(
                    "round %d %-24s %-9s c=%-3d %7.2f img/s  (ORT %.1f img/s, decode %.2f ms, HTTP %.2f ms)%s",
                    round_, ceiling.KEY, size, concurrency, limit["images_per_s"], limit["ort_images_per_s"],
                    limit["decode_cpu_ms"], limit["http_cpu_ms"], "  VOID" if limit["void"] else "",
                )  # fmt: skip
                continue
            url = running[key].url + by_key[key].path.format(model=model)
            with servers.alone(running, key):  # the others paused: none takes CPU from this point
                point = measure_point(url, files_by_size[size], concurrency=concurrency, seconds=seconds, warmup=warmup)
            point["round"] = round_
            measured.setdefault((key, size, concurrency), []).append(point)
            log.info(
                "round %d %-24s %-9s c=%-3d %7.2f req/s  p50 %7.1f  p99 %7.1f ms  errors %d  foreign %.2f cores%s",
                round_, key, size, concurrency, point["throughput"], point["p50_ms"], point["p99_ms"],
                point["errors"], point["load"]["foreign_cores"], "  VOID" if point["void"] else "",
            )  # fmt: skip
    return [
        {
            "model": model,
            "server": key,
            "label": by_key[key].label,
            "size": size,
            "concurrency": concurrency,
            **report.summarise(points),
            "rounds_detail": points,
            **({"ceiling_rounds": probed[(size, concurrency)]} if (size, concurrency) in probed else {}),
        }
        for (key, size, concurrency), points in measured.items()
    ]


def measure_http_cpu(files_by_size: dict[str, list[Path]], *, concurrency: int, seconds: float, warmup: float,
                     log_dir: Path) -> dict:  # fmt: skip
    """CPU seconds per request of an endpoint that only reads the multipart body (bench/echo_app.py), by size."""
    echo = servers.echo()
    costs = {}
    with servers.all_running([echo], log_dir) as running:
        server = running[echo.key]
        for size, files in files_by_size.items():

            def measure(files: list[Path] = files) -> dict:
                return ceiling.http_cpu(
                    server, echo.path, files, concurrency=concurrency, seconds=seconds, warmup=warmup
                )

            costs[size] = _quietly(measure, f"HTTP cost {size}")
            log.info("HTTP alone, %s: %.2f ms of CPU per request", size, costs[size]["cpu_ms_per_request"])
    return costs


def ceilings(results: dict, cores: int) -> dict:
    """The ceiling of each size from (a), the decode cost and the HTTP cost (void if any of them was)."""
    out = {}
    for size, raw_ in results["raw"].items():
        http = results["http_cpu"][size]
        decode_ms, http_ms = results["decode"][size]["draft_ms"], http["cpu_ms_per_request"]
        ort = raw_["a"]["images_per_s"]
        out[size] = {
            "ort_images_per_s": ort,
            "decode_cpu_ms": decode_ms,
            "http_cpu_ms": http_ms,
            "cores": cores,
            "images_per_s": report.ceiling(ort, decode_ms / 1e3, http_ms / 1e3, cores),
            "void": bool(raw_["void"] or http["void"]),
        }
    return out


def trained_models(repository: Path) -> list[tuple[str, Path]]:
    """(name, version folder) of the highest version of every classification model in the repository."""
    found = []
    for name_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        versions = sorted((p for p in name_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        if versions and load_manifest(versions[-1] / "model.json").task == classification.TASK.name:
            found.append((name_dir.name, versions[-1]))
    return found


def one_model_repository(work: Path, name: str, version_dir: Path) -> Path:
    """A repository holding one version of ``name`` alone (a link to its folder, no config.json, so the
    default policy serves it): each server serves one model version, as (e) and (f) do.

    Linking the whole model folder served every version its config.json names: ``vit-cifar10``'s
    two (``latest: 2``), which split the cores between them (one one-thread session each, no
    wide session) while (e) and (f) served the one measured (found 2026-12-05).
    """
    root = work / "trained" / f"{name}-{version_dir.name}"
    (root / name).mkdir(parents=True, exist_ok=True)
    link = root / name / version_dir.name
    if not link.exists():
        link.symlink_to(version_dir.resolve(), target_is_directory=True)
    return root


def fresh_tuning(contestants: list[servers.Server], cache: Path) -> list[servers.Server]:
    """patchserve's contestants with a new auto-tuner cache: it measures on this machine now, not from a past run."""
    return [
        dataclasses.replace(s, env={**s.env, "PATCHSERVE_TUNE_CACHE": str(cache)})
        if s.key.startswith(PATCHSERVE)
        else s
        for s in contestants
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("bench/.work"), help="images, model, logs (gitignored)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured (but watched) seconds before each point")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point (at least 3 for the docs)")
    parser.add_argument("--raw-seconds", type=float, default=5.0, help="seconds per (a)/(b) measurement")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--servers", default="patchserve,patchserve-no-batching,naive,litserve")
    parser.add_argument("--trained", default="model_repository", type=Path, help="also bench these models ('' skips)")
    parser.add_argument(
        "--no-round-ceiling",
        action="store_true",
        help="measure the ceiling at the start only, not again in every round (bench/ceiling.py; about 8 s "
        "per point and round)",
    )
    parser.add_argument("--docs", type=Path, default=None, help="write the tables into this page (docs/performance.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    started = dt.datetime.now(dt.UTC)
    info = machine()
    log.info("machine: %s, %s, load average %s", info["cpu"], info["cpus"], info["load_average"])
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    files = images.prepare(args.work / "images")
    files_by_size = {size: files[size] for size in args.sizes.split(",")}
    repository = args.work / "model_repository"
    model_dir = repository / BENCH_MODEL / "1"
    if not (model_dir / "model.onnx").is_file():
        sys.exit(f"{model_dir}/model.onnx is missing: `make bench` exports it (python -m export random vit-ti16 ...)")
    wanted = args.servers.split(",")
    cache = args.work / "tune-cache" / f"{started:%Y%m%dT%H%M%S}"
    contestants = fresh_tuning([s for s in servers.contestants(repository, BENCH_MODEL) if s.key in wanted], cache)
    rounds = max(1, args.rounds)

    results: dict = {
        "command": "make bench",
        "argv": sys.argv[1:] if argv is None else argv,
        "started": started.isoformat(timespec="seconds"),
        "machine": info,
        "protocol": {
            "seconds": args.seconds,
            "warmup": args.warmup,
            "rounds": rounds,
            "order": "turned",  # by one place each round (schedule); runs before 2026-12-07 21:46 UTC: fixed
            "raw_seconds": args.raw_seconds,
            "concurrency": concurrencies,
            "void_threshold_cores": quiet.THRESHOLD,
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
        "autotune": {},
    }
    results["http_cpu"] = measure_http_cpu(
        files_by_size,
        concurrency=ceiling.HTTP_CONCURRENCY,
        seconds=args.seconds,
        warmup=args.warmup,
        log_dir=args.work / "logs",
    )
    results["ceiling"] = ceilings(results, info["cores"])
    round_ceiling = None
    if not args.no_round_ceiling:
        best = {size: r["a"] for size, r in results["raw"].items()}
        round_ceiling = ceiling.Probe(model_dir, files_by_size, best, cores=info["cores"])
    results["protocol"]["round_ceiling"] = round_ceiling.settings() if round_ceiling is not None else None
    results["http"] = measure_http(
        contestants,
        files_by_size,
        concurrencies,
        model=BENCH_MODEL,
        model_dir=model_dir,
        seconds=args.seconds,
        warmup=args.warmup,
        rounds=rounds,
        log_dir=args.work / "logs",
        tuned=results["autotune"],
        ceiling_probe=round_ceiling,
    )

    results["trained"] = []
    if str(args.trained) and args.trained.is_dir():
        first_size = next(iter(files_by_size))
        for name, version_dir in trained_models(args.trained):
            alone = one_model_repository(args.work, name, version_dir)
            these = [s for s in servers.contestants(alone, name, version_dir.name) if s.key in wanted]
            these = fresh_tuning([s for s in these if s.key != "patchserve-no-batching"], cache)
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
                        rounds=rounds,
                        log_dir=args.work / "logs" / name,
                        tuned=results["autotune"],
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
    if any(not r["void"] for r in results["http"]):
        plots.plot(results, args.out / stem)
    else:
        log.warning("every point was void (the machine was not quiet): no plots")
    text = report.markdown(results, path)
    if args.docs is not None:
        report.write_docs(text, args.docs)
    print(text)


if __name__ == "__main__":
    main()
