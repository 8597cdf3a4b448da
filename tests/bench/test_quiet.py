"""The void-point logic on synthetic /proc snapshots: whose CPU time is foreign, and when a point is void."""

from __future__ import annotations

from pathlib import Path

from bench import quiet
from bench.quiet import Process, Snapshot, load_between, parse_stat, snapshot, void_reason

HZ = quiet.CLOCK_TICKS
BENCH, SERVER, WORKER, WRK, SSHD, TRAINER = 100, 200, 201, 300, 50, 60


def ticks(cores: float, seconds: float = 10.0) -> int:
    return round(cores * seconds * HZ)


def snap(at: float, processes: list[Process], extra_busy: int = 0) -> Snapshot:
    """A snapshot whose machine-wide busy time is exactly its processes' (plus ``extra_busy`` ticks)."""
    by_pid = {p.pid: p for p in processes}
    return Snapshot(at, by_pid, sum(p.ticks + p.child_ticks for p in processes) + extra_busy)


def before() -> Snapshot:
    return snap(
        0.0,
        [
            Process(1, 0, "init", 500, 0),
            Process(SSHD, 1, "sshd", 40, 0),
            Process(BENCH, 1, "python", 900, 0),
            Process(SERVER, BENCH, "python", 3_000, 0),
            Process(WORKER, SERVER, "python", 1_000, 0),  # a LitServe worker: a grandchild
            Process(WRK, BENCH, "wrk", 10, 0),
        ],
    )


def after(*foreign: Process, extra_busy: int = 0, reaped_wrk: bool = True) -> Snapshot:
    wrk = ticks(0.05)
    processes = [
        Process(1, 0, "init", 500, 0),
        Process(SSHD, 1, "sshd", 40, 0),
        Process(BENCH, 1, "python", 905, (10 + wrk) if reaped_wrk else 0),  # wrk ran, exited, was reaped
        Process(SERVER, BENCH, "python", 3_000 + ticks(1.5), 0),
        Process(WORKER, SERVER, "python", 1_000 + ticks(0.3), 0),
        *foreign,
    ]
    if not reaped_wrk:
        processes.append(Process(WRK, BENCH, "wrk", 10 + wrk, 0))
    return snap(10.0, processes, extra_busy)


def test_the_benchmarks_own_tree_reaped_children_included_is_not_foreign() -> None:
    load = load_between(before(), after(), {BENCH})
    assert load.foreign_cores == 0.0 and load.residual_cores == 0.0
    assert abs(load.benchmark_cores - (0.005 + 1.5 + 0.3 + 0.05)) < 1.5 / HZ
    assert void_reason(load) == ""
    assert load_between(before(), after(reaped_wrk=False), {BENCH}).foreign_cores == 0.0


def test_a_training_run_beside_the_benchmark_voids_the_point_and_is_named() -> None:
    trainer = Process(TRAINER, 1, "python", 7_000 + ticks(0.9), 0)
    start = before()
    start.processes[TRAINER] = Process(TRAINER, 1, "python", 7_000, 0)
    load = load_between(start, after(trainer), {BENCH})
    assert abs(load.foreign_cores - 0.9) < 1e-9 and load.top[0][:2] == (TRAINER, "python")
    assert void_reason(load).startswith("foreign processes took 0.90 cores (> 0.10): python (60) 0.90")


def test_foreign_load_up_to_a_tenth_of_a_core_is_tolerated() -> None:
    start = before()
    start.processes[TRAINER] = Process(TRAINER, 1, "cron", 0, 0)
    assert void_reason(load_between(start, after(Process(TRAINER, 1, "cron", ticks(0.09), 0)), {BENCH})) == ""
    assert void_reason(load_between(start, after(Process(TRAINER, 1, "cron", ticks(0.11), 0)), {BENCH})) != ""


def test_a_process_that_started_during_the_point_counts_whole() -> None:
    load = load_between(before(), after(Process(400, 1, "pytest", ticks(0.4), 0)), {BENCH})
    assert abs(load.foreign_cores - 0.4) < 1e-9 and void_reason(load) != ""


def test_processes_that_came_and_went_between_the_snapshots_show_in_the_residual() -> None:
    # A test suite starting many short interpreters: none is in either snapshot, the machine was busier.
    load = load_between(before(), after(extra_busy=ticks(0.5)), {BENCH})
    assert load.foreign_cores == 0.0 and abs(load.residual_cores - 0.5) < 1e-9
    assert "busier than the benchmark's processes" in void_reason(load)
    # A small accounting difference (under 5 % of the benchmark's own CPU on top of 0.1 cores) is not load.
    assert void_reason(load_between(before(), after(extra_busy=ticks(0.15)), {BENCH})) == ""


def test_a_kernel_worker_renamed_by_its_work_queue_counts_only_what_it_spent() -> None:
    # kworker threads take the name of the work queue they serve; a rename is not a new process.
    worker = Process(TRAINER, 2, "kworker/u8:1-events_unbound", 1_340, 0, started=5)
    start = snap(0.0, [*before().processes.values(), worker])
    renamed = Process(TRAINER, 2, "kworker/u8:1-kvfree_rcu_reclaim", 1_340 + ticks(0.01), 0, started=5)
    load = load_between(start, after(renamed), {BENCH})
    assert abs(load.foreign_cores - 0.01) < 1e-9 and void_reason(load) == ""
    # The same pid with another start time is another process: all of its time is new.
    reused = Process(TRAINER, 1, "python", ticks(0.3), 0, started=9_000)
    assert abs(load_between(start, after(reused), {BENCH}).foreign_cores - 0.3) < 1e-9


def test_time_the_hypervisor_took_voids_the_point() -> None:
    start, end = before(), after()
    stolen = Snapshot(end.at, end.processes, end.busy_ticks, steal_ticks=start.steal_ticks + ticks(0.3))
    load = load_between(start, stolen, {BENCH})
    assert abs(load.steal_cores - 0.3) < 1e-9 and load.foreign_cores == 0.0
    assert void_reason(load) == "the hypervisor took 0.30 cores (steal time > 0.10)"
    slight = Snapshot(end.at, end.processes, end.busy_ticks, steal_ticks=start.steal_ticks + ticks(0.05))
    assert void_reason(load_between(start, slight, {BENCH})) == ""


def test_stat_lines_parse_with_spaces_and_parentheses_in_the_name() -> None:
    line = "4242 (tmux: server (1)) S 1 4242 4242 0 -1 4194560 100 0 0 0 73 21 5 7 20 0 1 0 100 0 0"
    assert parse_stat(4242, line) == Process(4242, 1, "tmux: server (1)", 94, 12, started=100)


def test_a_snapshot_reads_every_process_and_the_machine_total(tmp_path: Path) -> None:
    for pid, name, ppid, utime in ((1, "init", 0, 5), (77, "python", 1, 40)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(
            f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} 2 0 0 20 0 1 0\n"
        )
    (tmp_path / "self").mkdir()  # not a pid: skipped
    (tmp_path / "stat").write_text("cpu  1000 20 300 5000 10 0 4 7 0 0\ncpu0 500 10 150 2500 5 0 2 3 0 0\n")
    taken = snapshot(tmp_path)
    assert sorted(taken.processes) == [1, 77] and taken.processes[77].ticks == 42
    assert (taken.busy_ticks, taken.steal_ticks) == (1320, 7)
