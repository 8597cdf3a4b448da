"""Where patchserve's time goes under load: CPU time per request by thread, and py-spy's hot spots.

    make profile                                            # 640x480 at concurrency 16
    .venv/bin/python -m bench.profile --size 4000x3000 --concurrency 16 --seconds 20

Starts patchserve on the benchmark model (``make bench``'s settings; ``PATCHSERVE_*``
variables in the environment apply on top), drives it with wrk, and measures two things:

1. **CPU milliseconds per request, by thread** — from the kernel's per-thread accounting
   (``/proc/<pid>/task/<tid>/stat``) before and after the load, so time lost to other
   processes on a busy machine is not counted. Threads are named from ``py-spy dump``: the
   event loop (``MainThread``: uvicorn, FastAPI, multipart parsing, the batcher, responses),
   the decode pool (``decode_*``: Pillow decoding and preprocessing), the runner threads
   (``run-*``: they call ONNX Runtime and compute in it), and threads Python does not know,
   ONNX Runtime's own intra-op pool. Beside it, each group's **wait for a core**: the time its
   threads were runnable but not running (``/proc/<pid>/task/<tid>/schedstat``, the kernel's
   run-queue delay), and for the runner threads their **idle** time, neither running nor
   waiting for a core: waiting for work (a batch handed over by the event loop). Under load
   with a queue, idle runner time is time lost to hand-offs.
2. **py-spy's sampled Python stacks** (``py-spy record --format raw``), summarised as the
   functions holding the most samples (inclusive) in each thread group.

Writes the collapsed stacks under ``bench/.work/profile/`` (open them with speedscope or
flamegraph.pl) and prints both tables.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from bench import images, loadgen, servers

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BENCH = "vit-ti16-random"


def thread_names(pid: int, py_spy: Path) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``py-spy dump``."""
    dump = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, check=True)
    return {int(tid): name for tid, name in re.findall(r'^Thread (\d+) \(\w+\): "([^"]+)"', dump.stdout, re.M)}


def cpu_seconds(pid: int) -> dict[int, float]:
    """user + system CPU seconds of every thread of ``pid``, by OS thread id."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return seconds


def schedstat_seconds(pid: int) -> dict[int, tuple[float, float]]:
    """(seconds on a core, seconds runnable but waiting for one) of every thread of ``pid``, by OS
    thread id (``/proc/<pid>/task/<tid>/schedstat``: nanoseconds; empty where the kernel keeps no
    schedstats)."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran, waited, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        seconds[int(task.name)] = (int(ran) / 1e9, int(waited) / 1e9)
    return seconds


def profiled(model: Path | None, work: Path) -> tuple[Path, str, str]:
    """(repository, name, version) that both servers serve: ``model``'s highest version alone, as
    ``make bench`` serves a trained model (:func:`bench.run.one_model_repository`: a model's whole
    folder would serve every version its config.json names, each with a share of the cores), or
    the benchmark's random ViT-Ti/16 (``make bench``'s) when ``model`` is None."""
    from bench.run import one_model_repository

    folder = model if model is not None else work / "model_repository" / BENCH
    highest = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if model is None:
        return folder.parent, BENCH, highest.name
    return one_model_repository(work, model.name, highest), model.name, highest.name


def group(name: str | None) -> str:
    if name is None:
        return "onnxruntime pool (native threads)"
    if name == "MainThread":
        return "event loop (MainThread)"
    for prefix, label in (("decode", "decode pool"), ("run-", "runner threads (ORT run)")):
        if name.startswith(prefix):
            return label
    return f"other ({name})"


def hot_spots(collapsed: Path, names: dict[int, str], top: int = 10) -> dict[str, list[tuple[str, float]]]:
    """The functions with the most samples (inclusive), by thread group, as shares of the group's samples.

    Frames in (nearly) every sample of a group (thread start-up, the event loop's entry point)
    and the thread pools' idle wait (``queue.get``) are left out: they say nothing.
    """
    by_group: dict[str, Counter[str]] = {}
    sizes: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        tid = re.search(r"\((\d+)\)", frames[0])
        label = group(names.get(int(tid.group(1)), "?") if tid else None)
        if frames[-1].startswith("_worker (concurrent/futures/thread.py:81)"):  # waiting for work
            continue
        counter = by_group.setdefault(label, Counter())
        for frame in set(frames[1:]):
            counter[frame] += int(n)
        sizes[label] += int(n)
    return {
        label: [(f, n / sizes[label]) for f, n in c.most_common() if n < 0.99 * sizes[label]][:top]
        for label, c in by_group.items()
    }


def scheduling(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]], names: dict[int, str]
) -> dict[str, tuple[float, float, int]]:
    """By thread group: (seconds on a core, seconds waiting for one, threads) between two
    :func:`schedstat_seconds` readings; threads that ran for under 1 % of it are left out."""
    groups: dict[str, tuple[float, float, int]] = {}
    span = max((a[0] - before.get(t, (0.0, 0.0))[0] for t, a in after.items()), default=0.0)
    for tid, (ran, waited) in after.items():
        ran0, waited0 = before.get(tid, (0.0, 0.0))
        if ran - ran0 < 0.01 * span:
            continue
        label = group(names.get(tid))
        r, w, n = groups.get(label, (0.0, 0.0, 0))
        groups[label] = (r + ran - ran0, w + waited - waited0, n + 1)
    return groups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("bench/.work"))
    parser.add_argument("--size", default="640x480", choices=list(images.SIZES))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--rate",
        type=int,
        default=100,
        help="py-spy samples per second; 0: no py-spy (each sample stops the server's threads, which "
        "lowers its throughput: the CPU table is cleanest without it)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="<repository>/<name> to profile instead (e.g. model_repository/vit-digits: serving overhead alone)",
    )
    parser.add_argument(
        "--naive",
        action="store_true",
        help="measure the naive endpoint (bench/naive_app.py) on the model's highest version instead, "
        "for its CPU per request beside patchserve's",
    )
    args = parser.parse_args(argv)

    files = images.prepare(args.work / "images")[args.size]
    repository, name, version = profiled(args.model, args.work)
    server = servers.patchserve(repository, name)
    if args.naive:
        [server] = [s for s in servers.contestants(repository, name, version) if s.key == "naive"]
    out = args.work / "profile"
    out.mkdir(parents=True, exist_ok=True)
    collapsed = out / f"{server.key}-{name}-{args.size}-c{args.concurrency}.txt"
    py_spy = Path(sys.executable).with_name("py-spy")
    running = servers.start(server, args.work / "logs")
    pid = running.process.pid
    try:
        url = running.url + server.path
        loadgen.run(url, files, concurrency=args.concurrency, seconds=3)  # warm-up: every pool thread started
        names = thread_names(pid, py_spy)
        before, sched_before = cpu_seconds(pid), schedstat_seconds(pid)
        record = [str(py_spy), "record", "--pid", str(pid), "--threads", "--rate", str(args.rate)]
        sampler = None
        if args.rate > 0:
            sampler = subprocess.Popen(
                [*record, "--duration", str(max(1, round(args.seconds) - 2)), "--format", "raw", "-o", str(collapsed)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        result: list[loadgen.LoadResult] = []
        load = threading.Thread(
            target=lambda: result.append(loadgen.run(url, files, concurrency=args.concurrency, seconds=args.seconds))
        )
        load.start()
        load.join()
        after, sched_after = cpu_seconds(pid), schedstat_seconds(pid)
        if sampler is not None:
            sampler.wait()
    finally:
        running.stop()

    r = result[0]
    requests = max(1, round(r.throughput * r.seconds))
    print(
        f"{args.size}, concurrency {args.concurrency}: {r.throughput:.1f} req/s, p50 {r.p50_ms:.1f} ms, "
        f"p99 {r.p99_ms:.1f} ms, errors {r.errors}; load average {os.getloadavg()}"
    )
    spent: Counter[str] = Counter()
    for tid, seconds in after.items():
        spent[group(names.get(tid))] += seconds - before.get(tid, 0.0)
    total = sum(spent.values())
    print(f"\nCPU per request: {1e3 * total / requests:.2f} ms ({total / r.seconds:.2f} cores busy on average)")
    for label, seconds in spent.most_common():
        print(f"  {label:<40s} {1e3 * seconds / requests:7.2f} ms  {seconds / total:6.1%}")
    print("\nper thread group, as shares of the run's wall time (schedstat): on a core / waiting for one / neither")
    for label, (ran, waited, threads) in sorted(scheduling(sched_before, sched_after, names).items()):
        shares = (ran / r.seconds, waited / r.seconds, threads - (ran + waited) / r.seconds)
        print(f"  {label:<40s} {threads} thread(s): " + " / ".join(f"{x:5.2f}" for x in shares))
    if args.rate <= 0:
        return
    print(f"\npy-spy ({collapsed}): busiest functions, inclusive, as a share of each group's samples")
    for label, frames in hot_spots(collapsed, names).items():
        print(f"  {label}")
        for frame, share in frames:
            print(f"    {share:6.1%}  {frame}")


if __name__ == "__main__":
    main()
