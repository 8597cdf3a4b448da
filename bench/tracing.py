"""What tracing costs: patchserve with OpenTelemetry off and on, at one concurrency, in interleaved rounds.

    python -m bench.tracing                              # vit-cifar10, examples/chelsea.png (451x300), c=16
    python -m bench.tracing --rounds 9 --seconds 20 --model vit-cifar10 --image examples/chelsea.png

Not a test and not part of ``make test``: run it on a quiet machine (``make bench`` sets up wrk
and the bench extra). Two servers run side by side, the same model and settings, one with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointed at a sink in this process (an OTLP/HTTP endpoint that
reads each export and answers 200; the otel extra must be installed in this interpreter). Each
round measures both, in alternating order, with wrk at the given concurrency; a round where
other processes took more than ``--max-foreign`` of the machine's CPU (from ``/proc/stat``,
less the servers', wrk's and this process's own) is voided. Prints, and writes as JSON, each
server's throughput and p50/p99 (median with min-max over the valid rounds) and the overhead:
the median over rounds of 1 - on/off throughput, with its min-max.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import resource
import statistics
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from PIL import Image

from bench import loadgen, servers

log = logging.getLogger("bench.tracing")
ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint on loopback that accepts and drops every export; yields its base URL."""
    sink = ThreadingHTTPServer((servers.HOST, 0), _Sink)
    thread = threading.Thread(target=sink.serve_forever, name="otlp-sink", daemon=True)
    thread.start()
    try:
        yield f"http://{servers.HOST}:{sink.server_address[1]}"
    finally:
        sink.shutdown()
        sink.server_close()


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (everything but idle and iowait), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def _process_seconds(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _own_seconds(pids: list[int]) -> float:
    """CPU seconds of the servers, of this process and of its finished children (wrk)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (
        sum(_process_seconds(pid) for pid in pids) + me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
    )


def summary(values: list[float]) -> dict[str, float]:
    """``{"median": ..., "min": ..., "max": ...}`` of ``values`` (non-empty)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def overhead(rounds: list[dict]) -> dict[str, float] | None:
    """1 - on/off throughput per valid round, as median and min-max; None without a valid round."""
    ratios = [1 - r["on"]["throughput"] / r["off"]["throughput"] for r in rounds if r["valid"]]
    return summary(ratios) if ratios else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tracing", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="vit-cifar10")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--image", type=Path, default=ROOT / "examples" / "chelsea.png")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--max-foreign", type=float, default=0.05, help="share of all cores; above it a round is void")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    width, height = Image.open(args.image).size
    cores = os.cpu_count() or 1
    with otlp_sink() as sink:
        contestants = {
            "off": servers.patchserve(args.repository, args.model, key="tracing-off", label="tracing off"),
            "on": servers.patchserve(args.repository, args.model, key="tracing-on", label="tracing on"),
        }
        on = contestants["on"]
        contestants["on"] = servers.Server(
            on.key, on.label, on.argv, on.path, on.ready_path, {**on.env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink}
        )
        rounds = []
        with servers.all_running(list(contestants.values()), args.out / ".logs-tracing") as running:
            by_name = {name: running[server.key] for name, server in contestants.items()}
            pids = [r.process.pid for r in by_name.values()]
            for index in range(args.rounds):
                order = ["off", "on"] if index % 2 == 0 else ["on", "off"]
                measured, foreign = {}, 0.0
                for name in order:
                    url = by_name[name].url + contestants[name].path.format(model=args.model)
                    loadgen.run(url, [args.image], concurrency=args.concurrency, seconds=args.warmup)
                    busy, own = _busy_seconds(), _own_seconds(pids)
                    result = loadgen.run(url, [args.image], concurrency=args.concurrency, seconds=args.seconds)
                    share = ((_busy_seconds() - busy) - (_own_seconds(pids) - own)) / (result.seconds * cores)
                    foreign = max(foreign, share)
                    measured[name] = {**result.to_dict(), "foreign_cpu_share": share}
                valid = foreign <= args.max_foreign
                rounds.append({"round": index, "order": order, "valid": valid, **measured})
                log.info(
                    "round %d: off %.1f req/s, on %.1f req/s; foreign CPU %.1f %%%s",
                    index,
                    measured["off"]["throughput"],
                    measured["on"]["throughput"],
                    100 * foreign,
                    "" if valid else " (void)",
                )
    valid = [r for r in rounds if r["valid"]]
    results = {
        "what": f"{args.model}, {args.image.name} ({width}x{height}), c={args.concurrency}, "
        f"{args.seconds:g} s per point, {len(valid)} of {len(rounds)} rounds valid",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": cores,
        "rounds": rounds,
        "overhead": overhead(rounds),
        **{
            name: {
                metric: summary([r[name][metric] for r in valid])
                for metric in ("throughput", "p50_ms", "p99_ms")
                if valid
            }
            for name in ("off", "on")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tracing-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    cost = results["overhead"]
    print(results["what"])
    if cost is None:
        print("no valid round: the machine was not quiet enough (see --max-foreign)")
    else:
        print(
            f"tracing costs {100 * cost['median']:.1f} % of throughput "
            f"(min {100 * cost['min']:.1f} %, max {100 * cost['max']:.1f} %); written to {path}"
        )


if __name__ == "__main__":
    main()
