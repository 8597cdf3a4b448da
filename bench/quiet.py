"""Is the machine quiet? The CPU time of every process that is not part of the benchmark, from /proc.

A benchmark point is only worth quoting if nothing else ran while it was measured (issue 14:
the committed tables came from runs during which a training process held one of two cores).
:class:`Watch` snapshots /proc before and after a measurement and splits the CPU time spent in
between into the benchmark's own process tree (this process and every descendant: the servers
under test, their workers, wrk) and everything else, the *foreign* load, two ways:

* **per process**: utime + stime (proc(5), ``/proc/<pid>/stat`` fields 14 and 15, in clock
  ticks) of every process outside the tree, summed; this names the offenders;
* **residual**: the machine's user + nice + system time (``/proc/stat``'s ``cpu`` line) minus
  the tree's utime + stime + cutime + cstime (so children reaped during the point, wrk among
  them, count as ours). It also catches processes that started and exited between the two
  snapshots, which the per-process sum cannot see, but the kernel's two accountings differ
  by a few percent, so it is allowed 5 % of the benchmark's own CPU on top of the threshold.

A point during which the foreign load averaged more than ``THRESHOLD`` cores (10 % of one core),
or the hypervisor took as much from this virtual machine (steal time, ``/proc/stat``), is void:
:func:`void_reason` says why, the benchmark re-runs it once, and a point still loaded is reported
as void and never written into a table.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

THRESHOLD = 0.10  # cores of foreign load above which a point is void
RESIDUAL_SLACK = 0.05  # the residual may exceed the threshold by this share of the benchmark's own CPU
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Process:
    """One process's CPU time in clock ticks (proc(5)) and its parent."""

    pid: int
    ppid: int
    name: str
    ticks: int  # utime + stime
    child_ticks: int  # cutime + cstime: reaped children's
    started: int = 0  # starttime, clock ticks after boot: tells a reused pid from the process it had


@dataclass(frozen=True)
class Snapshot:
    """Every process and the machine's busy ticks (user + nice + system), at ``at`` (monotonic seconds)."""

    at: float
    processes: dict[int, Process]
    busy_ticks: int
    steal_ticks: int = 0


def parse_stat(pid: int, text: str) -> Process:
    """``/proc/<pid>/stat`` -> :class:`Process` (the name may hold spaces and parentheses)."""
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state)
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    started = int(fields[19]) if len(fields) > 19 else 0  # field 22
    return Process(pid, ppid, name, utime + stime, cutime + cstime, started)


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``/proc/stat`` -> (user + nice + system, steal) ticks of all CPUs."""
    line = next(ln for ln in text.splitlines() if ln.startswith("cpu "))
    values = [int(v) for v in line.split()[1:]]
    steal = values[7] if len(values) > 7 else 0
    return values[0] + values[1] + values[2], steal


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    """Read every ``/proc/<pid>/stat`` and ``/proc/stat`` now (processes that vanish meanwhile are skipped)."""
    at = time.monotonic()
    processes = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            processes[int(entry.name)] = parse_stat(int(entry.name), (entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    busy, steal = parse_proc_stat((proc / "stat").read_text())
    return Snapshot(at, processes, busy, steal)


def tree(snap: Snapshot, roots: set[int]) -> set[int]:
    """``roots`` and every descendant of them in ``snap``."""
    children: dict[int, list[int]] = {}
    for p in snap.processes.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found, stack = set(), [r for r in roots if r in snap.processes]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    return found


@dataclass
class Load:
    """The CPU spent between two snapshots, in cores (CPU seconds per wall second).

    Attributes:
        seconds: wall seconds between the snapshots.
        foreign_cores: processes outside the benchmark's tree, summed per process.
        residual_cores: the machine's busy time minus the tree's (short-lived processes too).
        benchmark_cores: the benchmark's own tree.
        steal_cores: time the hypervisor gave to other guests: the cores were taken from this
            machine's processes, the benchmark's included (judged like foreign load).
        top: the busiest foreign processes, (pid, name, cores), busiest first.
    """

    seconds: float
    foreign_cores: float
    residual_cores: float
    benchmark_cores: float
    steal_cores: float = 0.0
    top: list[tuple[int, str, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def load_between(before: Snapshot, after: Snapshot, roots: set[int]) -> Load:
    """Split the CPU time from ``before`` to ``after`` into the tree of ``roots`` and the rest."""
    ours = tree(before, roots) | tree(after, roots)
    seconds = max(after.at - before.at, 1e-9)
    per_process: dict[int, int] = {}
    for pid, p in after.processes.items():
        if pid in ours:
            continue
        old = before.processes.get(pid)
        # The same process if it started at the same time: not by name, which a kernel worker changes with the
        # work queue it serves ("kworker/u8:1-events_unbound", then "-kvfree_rcu_reclaim"); counting such a
        # renamed worker's whole lifetime as this point's load voided points that nothing had disturbed.
        spent = p.ticks - old.ticks if old is not None and old.started == p.started else p.ticks
        if spent > 0:
            per_process[pid] = spent

    def own(snap: Snapshot) -> int:
        return sum(snap.processes[pid].ticks + snap.processes[pid].child_ticks for pid in ours if pid in snap.processes)

    benchmark_ticks = max(0, own(after) - own(before))
    residual_ticks = (after.busy_ticks - before.busy_ticks) - benchmark_ticks

    def cores(ticks: float) -> float:
        return ticks / CLOCK_TICKS / seconds

    top = sorted(per_process.items(), key=lambda kv: -kv[1])[:5]
    return Load(
        seconds=seconds,
        foreign_cores=cores(sum(per_process.values())),
        residual_cores=cores(max(0, residual_ticks)),
        benchmark_cores=cores(benchmark_ticks),
        steal_cores=cores(after.steal_ticks - before.steal_ticks),
        top=[(pid, after.processes[pid].name, cores(t)) for pid, t in top],
    )


def tree_cpu_seconds(before: Snapshot, after: Snapshot, roots: set[int]) -> float:
    """CPU seconds the tree of ``roots`` spent between the snapshots (reaped children included)."""
    return load_between(before, after, roots).benchmark_cores * (after.at - before.at)


def void_reason(load: Load, threshold: float = THRESHOLD) -> str:
    """Why a point measured under ``load`` is void ("" when the machine was quiet enough)."""
    if load.foreign_cores > threshold:
        names = ", ".join(f"{name} ({pid}) {c:.2f}" for pid, name, c in load.top[:3])
        return f"foreign processes took {load.foreign_cores:.2f} cores (> {threshold:.2f}): {names}"
    if load.steal_cores > threshold:
        return f"the hypervisor took {load.steal_cores:.2f} cores (steal time > {threshold:.2f})"
    allowed = threshold + RESIDUAL_SLACK * load.benchmark_cores
    if load.residual_cores > allowed:
        return (
            f"the machine was {load.residual_cores:.2f} cores busier than the benchmark's processes "
            f"(> {allowed:.2f}; short-lived processes?)"
        )
    return ""


class Watch:
    """``with Watch() as w: measure()`` -> ``w.load``: the load while the block ran.

    Args:
        roots: the benchmark's processes (default: this one; its descendants are found at both ends).
        proc: the /proc to read (tests pass a fixture folder).
    """

    def __init__(self, roots: set[int] | None = None, proc: Path = Path("/proc")) -> None:
        self.roots = roots or {os.getpid()}
        self.proc = proc
        self.load: Load | None = None

    def __enter__(self) -> Watch:
        self._before = snapshot(self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        self.load = load_between(self._before, snapshot(self.proc), self.roots)
