"""The CPUs this process may really use, and the thread plan chosen from them.

``os.cpu_count()`` (and ONNX Runtime's default of one intra-op thread per physical core) counts
the machine's CPUs, not the ones the process gets: a container limited to 2 CPUs on a 64-core
host, or a process pinned with ``taskset``, would start 32 or 64 threads that then fight over 2
cores. :func:`usable_cpus` reads the two limits the kernel enforces:

* the **affinity mask** (``sched_getaffinity(2)``): the CPUs the scheduler may run it on;
* the **cgroup CPU quota**: cgroup v2 ``cpu.max`` (``"$MAX $PERIOD"``, or ``"max $PERIOD"`` for
  none; Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files"), or cgroup v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none;
  Documentation/scheduler/sched-bwc.rst). quota / period is the CPU time the group may use per
  unit of wall time, in cores; every ancestor's limit applies too, so the smallest one counts.

A quota of 1.5 cores rounds down to 1 (as Go's automaxprocs does): a second busy thread would
only be throttled.

:func:`plan_threads` then shares those cores out so that the threads that compute never
outnumber them: each worker process gets ``cores // workers``, each model version loaded in it
an equal share of that, each of its N instances (ONNX Runtime sessions) share // N intra-op
threads, and on the CPU a wide session with the whole share runs a lone request. Spinning (ORT's
threads busy-wait between parallel sections of a run instead of sleeping) is on only when those
threads fit the cores; every value can be forced by a setting.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class UsableCpus:
    """The CPUs a process may use.

    Attributes:
        cores: whole cores it may keep busy: min(affinity, floor(quota)), at least 1.
        affinity: CPUs in its affinity mask.
        quota: the cgroup CPU quota in cores (quota / period), None when there is none.
        quota_source: the file the quota came from ("" when none was found).
    """

    cores: int
    affinity: int
    quota: float | None = None
    quota_source: str = ""

    def describe(self) -> str:
        """E.g. "2 usable cores (affinity 2 CPUs, no cgroup CPU quota)"."""
        quota = (
            "no cgroup CPU quota" if self.quota is None else f"cgroup quota {self.quota:g} cores ({self.quota_source})"
        )
        noun = "core" if self.cores == 1 else "cores"
        return f"{self.cores} usable {noun} (affinity {self.affinity} CPUs, {quota})"


def _cgroup_paths(proc_self_cgroup: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu controller path) of this process, from ``/proc/self/cgroup`` (cgroups(7)).

    Lines are ``hierarchy-ID:controller-list:path``; v2's is ``0::path``.
    """
    v2 = v1 = None
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(base: Path, path: str) -> Iterable[Path]:
    """``base/path`` and each of its parents up to ``base``; just ``base`` when ``base/path`` is absent.

    Inside a container the path the kernel reports may be the host's while the container's own
    cgroup is mounted at ``base``, so a path that does not exist falls back to ``base`` itself.
    """
    folder = base / path.lstrip("/")
    if not folder.is_dir():
        yield base
        return
    while True:
        yield folder
        if folder == base or base not in folder.parents:
            return
        folder = folder.parent


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_quota(
    cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> tuple[float | None, str]:
    """The smallest CPU quota of this process's cgroup and its ancestors, in cores.

    Args:
        cgroup_root: where the cgroup filesystems are mounted (v2 there, v1 controllers in
            ``cpu`` or ``cpu,cpuacct`` below it); tests pass a folder of fixture files.
        proc_self_cgroup: this process's cgroup membership file.

    Returns:
        (cores, the file it came from); (None, "") when no quota applies or none can be read.
    """
    v2, v1 = _cgroup_paths(proc_self_cgroup)
    found: list[tuple[float, str]] = []
    if v2 is not None and (cgroup_root / "cgroup.controllers").is_file():
        for folder in _ancestors(cgroup_root, v2):
            text = _read(folder / "cpu.max")
            if text:
                limit, _, period = text.partition(" ")
                if limit != "max" and period:
                    found.append((int(limit) / int(period), str(folder / "cpu.max")))
    if v1 is not None and not found:
        for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            base = cgroup_root / name
            if not base.is_dir():
                continue
            for folder in _ancestors(base, v1):
                quota, cfs_period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota and cfs_period and int(quota) > 0 and int(cfs_period) > 0:
                    found.append((int(quota) / int(cfs_period), str(folder / "cpu.cfs_quota_us")))
            break
    if not found:
        return None, ""
    return min(found)


def usable_cpus(
    *,
    affinity: set[int] | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    proc_self_cgroup: Path = PROC_SELF_CGROUP,
) -> UsableCpus:
    """The cores this process may keep busy: its affinity mask, capped by its cgroup CPU quota.

    Args:
        affinity: the CPU set to use instead of ``os.sched_getaffinity(0)`` (tests).
        cgroup_root, proc_self_cgroup: see :func:`cgroup_quota`.
    """
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    quota, source = cgroup_quota(cgroup_root, proc_self_cgroup)
    cores = len(affinity)
    if quota is not None:
        cores = min(cores, math.floor(quota + 1e-9))
    return UsableCpus(max(1, cores), len(affinity), quota, source)


@dataclass(frozen=True)
class ThreadPlan:
    """How many sessions and threads one model version gets in one worker process.

    Attributes:
        instances: ONNX Runtime sessions fed by the model's batcher.
        intra_op_threads: threads parallelising one run of one session (ORT counts the calling
            thread as one of them).
        spinning: let those threads busy-wait between parallel sections (ORT's
            ``session.intra_op.allow_spinning``); they stop when the session's last run returns.
        decode_threads: the worker's image-decoding pool.
        wide_threads: intra-op threads of the wide session, which runs a request that arrives
            alone while every instance is idle (:mod:`service.batching.runners`); 0: none.
        wide: the setting: the wide session forced on (True) or off (False); None: chosen.
        wide_note: why a wide session planned was left out (:meth:`without_wide`); "" if none was.
        share: cores this model version may keep busy (its share of the worker's).
        cores: the process's usable cores, and ``workers``, ``models`` it was shared between.
        forced: the names of the values a setting fixed.
        reason: how the values were chosen, in words (shown by ``GET /v1/models``).
    """

    instances: int
    intra_op_threads: int
    spinning: bool
    decode_threads: int
    share: int
    cores: UsableCpus
    workers: int = 1
    models: int = 1
    forced: frozenset[str] = frozenset()
    reason: str = ""
    wide_threads: int = 0
    device_type: str = "cpu"
    wide: bool | None = None
    wide_note: str = ""

    @property
    def computing_threads(self) -> int:
        """Threads all the worker processes' models compute with at once, at most (the wide session
        never runs beside the instances)."""
        return self.workers * self.models * max(self.instances * self.intra_op_threads, self.wide_threads)

    def with_instances(self, instances: int) -> ThreadPlan:
        """The plan for ``instances`` sessions (the tuner's choice); a forced value stays as it was."""
        if "instances" in self.forced or instances == self.instances:
            return self
        return _finish(dataclasses.replace(self, instances=instances))

    def without_wide(self, why: str) -> ThreadPlan:
        """The plan with no wide session, because of ``why`` (a measurement; shown in the reason)."""
        return _finish(dataclasses.replace(self, wide=False, wide_note=why))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _finish(plan: ThreadPlan) -> ThreadPlan:
    """Fill in the intra-op threads and spinning that follow from the instance count, and the reason."""
    threads = plan.intra_op_threads if "intra_op_threads" in plan.forced else max(1, plan.share // plan.instances)
    if plan.device_type != "cpu":
        wide = 0  # a GPU runs a lone request on its own device: nothing to widen
    elif plan.wide is not None:
        wide = plan.share if plan.wide else 0
    else:  # on when a lone request would otherwise run on fewer threads than the model's share of cores
        wide = plan.share if threads < plan.share else 0
    plan = dataclasses.replace(plan, intra_op_threads=threads, wide_threads=wide)
    fits = plan.computing_threads <= plan.cores.cores
    spinning = plan.spinning if "spinning" in plan.forced else fits
    plan = dataclasses.replace(plan, spinning=spinning)

    def mark(name: str) -> str:
        return " (set)" if name in plan.forced else ""

    shared = []
    if plan.workers > 1:
        shared.append(f"{plan.workers} workers")
    if plan.models > 1:
        shared.append(f"{plan.models} model versions")
    among = f", shared by {' and '.join(shared)}: {plan.share} per model" if shared else ""
    spin = "on, stopping when a run ends" if spinning else "off"
    fit = "" if fits else f"; {plan.computing_threads} computing threads on {plan.cores.cores} cores: oversubscribed"
    reason = (
        f"{_count(plan.cores.cores, 'usable core')}{among}: {_count(plan.instances, 'instance')}{mark('instances')} × "
        f"{_count(plan.intra_op_threads, 'intra-op thread')}{mark('intra_op_threads')}"
        f"{f', a {plan.wide_threads}-thread wide session for lone requests' if plan.wide_threads else ''}"
        f"{', no wide session' if 'wide' in plan.forced and not plan.wide_threads else ''}{mark('wide')}"
        f"{f', no wide session: {plan.wide_note}' if plan.wide_note and not plan.wide_threads else ''}"
        f", spinning {spin}"
        f"{mark('spinning')}, {_count(plan.decode_threads, 'decode thread')}{mark('decode_threads')}{fit}"
    )
    return dataclasses.replace(plan, reason=reason)


def plan_threads(
    cores: UsableCpus,
    *,
    workers: int = 1,
    models: int = 1,
    device_type: str = "cpu",
    instances: int | None = None,
    intra_op_threads: int = 0,
    spinning: bool | None = None,
    decode_threads: int = 0,
    wide: bool | None = None,
) -> ThreadPlan:
    """Choose instances, intra-op threads, spinning and decode threads from the usable cores.

    Defaults (each overridden by the argument when given: None or 0 means "choose"):

    * instances: on the CPU 2 when the model's share is 2 cores or more, else 1: sessions side
      by side served about 20 % more under load than one session with every core, whose
      parallel sections wait for threads the decoders push off their cores (``bench.variants``
      on 2 cores; docs/performance.md); 2 on a GPU, so one batch's copies overlap another's
      compute;
    * intra-op threads: the model's share of cores // instances (at least 1);
    * wide session: on the CPU, when the instances' threads are fewer than the share, one more
      session with the whole share runs a request that arrives alone while they are idle (a
      lone request ran about a third faster on it); never beside them
      (:mod:`service.batching.runners`);
    * spinning: on when workers × models × the threads of one model's sessions that run at once
      (the instances', or the wide session's) fit the cores (at
      concurrency 1 spinning gave the best latency; ORT stops it when a run ends, so the
      decoders get the cores between runs); off when they do not fit, where a spinning thread
      would take a core another needs;
    * decode threads: the worker's share of cores (they run only while images wait, never spin).

    Args:
        cores: what :func:`usable_cpus` found.
        workers: worker processes sharing the cores.
        models: model versions loaded in each worker, sharing the worker's cores.
        device_type: "cpu" or "cuda" (the provider the sessions get).
    """
    per_worker = max(1, cores.cores // max(1, workers))
    share = max(1, per_worker // max(1, models))
    forced = {
        name
        for name, given in (
            ("instances", instances is not None),
            ("intra_op_threads", intra_op_threads > 0),
            ("spinning", spinning is not None),
            ("decode_threads", decode_threads > 0),
            ("wide", wide is not None),
        )
        if given
    }
    plan = ThreadPlan(
        instances=instances if instances is not None else (2 if device_type == "cuda" or share >= 2 else 1),
        intra_op_threads=intra_op_threads,
        spinning=bool(spinning),
        decode_threads=decode_threads or per_worker,
        share=share,
        cores=cores,
        workers=workers,
        models=models,
        forced=frozenset(forced),
        device_type=device_type,
        wide=wide,
    )
    return _finish(plan)
