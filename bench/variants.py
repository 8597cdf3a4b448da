"""patchserve under several settings, side by side: how the thread and instance defaults were chosen.

    .venv/bin/python -m bench.variants --size 640x480 --concurrency 1,16 --rounds 2
    .venv/bin/python -m bench.variants one-session=instances:1 one-thread=instances:2,intra_op_threads:1
    .venv/bin/python -m bench.variants --model vit-digits --naive --concurrency 1 no-wide=wide_session:false

Each variant is a name and ``PATCHSERVE_*`` settings (lower case, ``name:value`` pairs, comma
separated) applied on top of the defaults. Every variant is started at once and each
(concurrency, round) point is measured for each variant in turn, so load from elsewhere on the
machine hits them alike; each point is watched for foreign load (:mod:`bench.quiet`) and marked
void when the machine was not quiet. The order turns by one place each round (A B C, B C A,
C A B: :func:`bench.run.rotated`), so no variant always holds the same place. Writes
``bench/results/variants-<date>-<host>.json`` and prints a table.

``--model NAME`` serves a trained classifier from ``model_repository/`` (its highest version, alone,
as ``make bench`` serves the trained models) instead of the random ViT-Ti/16; ``--naive`` adds the
naive FastAPI endpoint (``bench/naive_app.py``) on the same model as a reference contestant.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import socket
from pathlib import Path

import httpx

from bench import images, loadgen, quiet, run, servers

MODEL = "vit-ti16-random"
DEFAULT_VARIANTS = {
    "defaults": {},  # from the usable cores (1 session x every core, spinning) and the auto-tuner
    "two-sessions": {"instances": "2"},
    "no-spinning": {"intra_op_spinning": "false"},
    "tuner-off": {"auto_tune": "false"},  # the hardware defaults, max_batch_size 8
    "one-decode-thread": {"decode_threads": "1"},
}


def settings_in_use(url: str, model: str = MODEL) -> dict:
    """The benchmark model's batching, threads and auto-tune choice, from ``GET /v1/models/{model}``."""
    version = httpx.get(f"{url}/v1/models/{model}", timeout=10).json()["versions"][0]
    tuned = version.get("autotune") or {}
    return {"batching": version["batching"], "threads": version["threads"], "autotune": tuned.get("chosen")}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``name=setting:value,setting:value`` -> (name, {setting: value})."""
    name, _, settings = text.partition("=")
    pairs = [pair.split(":", 1) for pair in settings.split(",") if pair]
    return name, {key.strip(): value.strip() for key, value in pairs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.variants", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("variants", nargs="*", help="name=setting:value,... (default: the thread/instance variants)")
    parser.add_argument("--work", type=Path, default=Path("bench/.work"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--size", default="640x480", choices=list(images.SIZES))
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=MODEL, help="a classifier in --repository instead of the random ViT-Ti/16")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--naive", action="store_true", help="add the naive FastAPI endpoint on the same model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    variants = dict(parse_variant(v) for v in args.variants) if args.variants else DEFAULT_VARIANTS
    files = images.prepare(args.work / "images")[args.size]
    repository, version = args.work / "model_repository", "1"
    if args.model != MODEL:
        version_dir = dict(run.trained_models(args.repository))[args.model]
        repository, version = run.one_model_repository(args.work, args.model, version_dir), version_dir.name
    contestants = [servers.patchserve(repository, args.model, key=k, label=k, **v) for k, v in variants.items()]
    if args.naive:
        contestants += [s for s in servers.contestants(repository, args.model, version) if s.key == "naive"]
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    rows = []
    by_key = {server.key: server for server in contestants}
    with servers.all_running(contestants, args.work / "logs" / "variants") as running:
        for round_ in range(args.rounds):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for server in (by_key[key] for key in run.rotated(list(by_key), round_)):  # A B C, B C A, ...
                    url = running[server.key].url + server.path
                    with servers.alone(running, server.key):  # the other variants paused
                        loadgen.run(url, files, concurrency=concurrency, seconds=args.warmup)
                        with quiet.Watch() as watch:
                            r = loadgen.run(url, files, concurrency=concurrency, seconds=args.seconds)
                    assert watch.load is not None
                    void = quiet.void_reason(watch.load)
                    rows.append(
                        {
                            "variant": server.key,
                            "round": round_,
                            **r.to_dict(),
                            "load": watch.load.to_dict(),
                            "void": void,
                        }
                    )
                    print(
                        f"round {round_}  {server.key:<26s} c={concurrency:<3d} {r.throughput:7.1f} req/s  "
                        f"p50 {r.p50_ms:7.1f}  p99 {r.p99_ms:7.1f} ms  errors {r.errors}  "
                        f"foreign {watch.load.foreign_cores:.2f} cores{f'  VOID: {void}' if void else ''}",
                        flush=True,
                    )
        described = {  # what each variant ran with
            key: settings_in_use(r.url, args.model) for key, r in running.items() if key in variants
        }
    args.out.mkdir(parents=True, exist_ok=True)
    model = "" if args.model == MODEL else f"{args.model}-"
    path = args.out / f"variants-{model}{started:%Y-%m-%d}-{socket.gethostname()}.json"
    document = {
        "command": "python -m bench.variants",
        "started": started.isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "model": args.model,
        "size": args.size,
        "variants": variants,
        "order": "turned",  # by one place each round (bench.run.rotated); files before 2026-12-07 21:46 UTC: fixed
        "described": described,
        "results": rows,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    for key, used in described.items():
        print(f"{key}: max_batch_size {used['batching']['max_batch_size']}; {used['threads']['reason']}; "
              f"wide session ran {used['threads'].get('wide_session_batches', 0)} batches")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
