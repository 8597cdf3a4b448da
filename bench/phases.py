"""Whether this machine's two-thread ONNX Runtime runs go through slow phases: blocks of runs, timed.

    .venv/bin/python -m bench.phases                                  # ViT-Ti/16, 40 blocks of 20 runs
    .venv/bin/python -m bench.phases --model model_repository/vit-cifar10/3/model.onnx --runs 200

Times blocks of batch-of-one runs of one graph on zeros, in turn on a one-thread session and on
a two-thread session (spinning on, as the server's wide session and ONNX Runtime's default have
it), and, every few blocks, one one-thread session per core side by side in two processes, each
pinned to one of the first two CPUs this process may use. Prints each block's median run time,
then a summary (JSON): the two-thread blocks that ran at more than ``--slow`` times the fastest
two-thread block, and what the one-thread runs did meanwhile.

What it is for: on the 2-vCPU KVM machines this project is benched on, a two-thread run of
ViT-Ti/16 took 16.2 ms in some stretches of seconds and 25.3 ms in others, while one-thread runs
(28.4 ms) and each core alone kept their speed (2026-12-07, docs/performance.md). Every contestant
that answers a lone request with two threads (the naive endpoint's default session, patchserve's
wide session) is exposed to it, so a concurrency-1 round can land in either phase; this measures
how often. It runs nothing else and no server: run it on a quiet machine, as ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

MODEL = Path("bench/.work/model_repository/vit-ti16-random/1/model.onnx")
REPOSITORY = Path(__file__).resolve().parents[1]  # where ``python -m bench.phases`` finds the package


def at_least_one(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def session(path: Path, threads: int) -> ort.InferenceSession:
    """A CPU session with ``threads`` intra-op threads, spinning on (ORT's default)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def zeros_for(s: ort.InferenceSession) -> dict[str, np.ndarray]:
    """A batch of one of zeros for the graph's first input (dynamic axes taken as 1)."""
    first = s.get_inputs()[0]
    return {first.name: np.zeros([d if isinstance(d, int) else 1 for d in first.shape], np.float32)}


def block_ms(s: ort.InferenceSession, feed: dict[str, np.ndarray], runs: int) -> float:
    """The median milliseconds of ``runs`` runs, one after another."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        s.run(None, feed)
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1e3)


def pinned(path: Path, cpu: int, runs: int, start: float) -> None:
    """In a child process: a one-thread session pinned to ``cpu``, timed from ``start`` (``time.time()``)
    on, so that the two children's blocks overlap; prints its block's median ms."""
    os.sched_setaffinity(0, {cpu})
    s = session(path, 1)
    feed = zeros_for(s)
    s.run(None, feed)
    time.sleep(max(start - time.time(), 0.0))
    print(json.dumps(block_ms(s, feed, runs)))


def side_by_side(path: Path, runs: int, cpus: list[int], lead: float = 3.0) -> list[float]:
    """One pinned one-thread session per CPU of ``cpus`` at once: each one's median ms.

    Both children start timing ``lead`` seconds from now (time to import ONNX Runtime and build
    the session), so their blocks run at the same time.
    """
    start = time.time() + lead
    argv = [sys.executable, "-m", "bench.phases", "--model", str(path.resolve()), "--runs", str(runs)]
    children = [
        subprocess.Popen(
            [*argv, "--pinned", str(cpu), "--start", repr(start)], stdout=subprocess.PIPE, text=True, cwd=REPOSITORY
        )
        for cpu in cpus
    ]
    return [json.loads(child.communicate()[0]) for child in children]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL, help="an ONNX graph with one image input")
    parser.add_argument("--blocks", type=at_least_one, default=40, help="blocks per session")
    parser.add_argument("--runs", type=at_least_one, default=20, help="runs per block")
    parser.add_argument(
        "--every", type=at_least_one, default=8, help="the side-by-side check after every this many blocks"
    )
    parser.add_argument("--slow", type=float, default=1.25, help="a block this many times the fastest is slow")
    parser.add_argument("--pinned", type=int, default=None, help=argparse.SUPPRESS)  # the children of side_by_side
    parser.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pinned is not None:
        pinned(args.model, args.pinned, args.runs, args.start)
        return
    one, two = session(args.model, 1), session(args.model, 2)
    feed = zeros_for(one)
    one.run(None, feed)  # each session's first run, uncounted
    two.run(None, feed)
    ones, twos, pairs = [], [], []
    cpus = sorted(os.sched_getaffinity(0))[:2]  # the first two this process may use
    for block in range(args.blocks):
        ones.append(block_ms(one, feed, args.runs))
        twos.append(block_ms(two, feed, args.runs))
        line = f"block {block + 1:3d}: one thread {ones[-1]:8.3f} ms   two threads {twos[-1]:8.3f} ms"
        if (block + 1) % args.every == 0 and len(cpus) == 2:
            pairs.append(side_by_side(args.model, args.runs, cpus))
            line += f"   side by side, CPU {cpus[0]} {pairs[-1][0]:8.3f} ms, CPU {cpus[1]} {pairs[-1][1]:8.3f} ms"
        print(line, flush=True)
    summary = summarise(ones, twos, pairs, args.slow)
    print(f"\n{args.model}: {json.dumps(summary)}")


def summarise(ones: list[float], twos: list[float], pairs: list[list[float]], slow: float) -> dict:
    """The blocks' figures (ms): two threads' range and slow blocks (over ``slow`` times the fastest),
    one thread's range, and the side-by-side runs' range (None when there were none)."""
    fastest = min(twos)
    slow_blocks = [t for t in twos if t > slow * fastest]
    side = [t for pair in pairs for t in pair]
    return {
        "two_threads_ms": [fastest, max(twos)],
        "slow_blocks": len(slow_blocks),
        "blocks": len(twos),
        "slow_block_median_ms": float(np.median(slow_blocks)) if slow_blocks else None,
        "one_thread_ms": [min(ones), max(ones)],
        "side_by_side_ms": [min(side), max(side)] if side else None,
    }


if __name__ == "__main__":
    main()
