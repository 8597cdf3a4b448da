"""The usable CPUs (affinity and cgroup quota, from fixture files) and the thread plan chosen from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime.cpus import UsableCpus, cgroup_quota, plan_threads, usable_cpus


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def v2(tmp_path: Path, files: dict[str, str], member: str = "0::/kubepods/pod1/ctr\n") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    write(root, {"cgroup.controllers": "cpuset cpu io memory pids\n", **files})
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(member)
    return root, proc


def test_cgroup_v2_quota_is_max_over_period_and_the_tightest_ancestor_wins(tmp_path: Path) -> None:
    limits = {"kubepods": "max 100000", "kubepods/pod1": "150000 100000", "kubepods/pod1/ctr": "max 100000"}
    root, proc = v2(tmp_path, {f"{folder}/cpu.max": f"{text}\n" for folder, text in limits.items()})
    quota, source = cgroup_quota(root, proc)
    assert quota == 1.5 and source.endswith("kubepods/pod1/cpu.max")
    cpus = usable_cpus(affinity=set(range(8)), cgroup_root=root, proc_self_cgroup=proc)
    assert (cpus.cores, cpus.affinity, cpus.quota) == (1, 8, 1.5)  # 1.5 cores round down: a second thread is throttled
    assert cpus.describe().startswith("1 usable core (affinity 8 CPUs, cgroup quota 1.5 cores")


def test_cgroup_v2_without_a_limit_leaves_the_affinity_mask(tmp_path: Path) -> None:
    root, proc = v2(tmp_path, {"kubepods/pod1/ctr/cpu.max": "max 100000\n"})
    assert cgroup_quota(root, proc) == (None, "")
    assert usable_cpus(affinity={0, 1}, cgroup_root=root, proc_self_cgroup=proc) == UsableCpus(2, 2, None, "")


def test_cgroup_v2_inside_a_container_reads_its_own_root(tmp_path: Path) -> None:
    # The kernel reports the host's path, but the container sees its own cgroup at the mount point.
    root, proc = v2(tmp_path, {"cpu.max": "200000 100000\n"}, member="0::/system.slice/docker-abc.scope\n")
    assert cgroup_quota(root, proc)[0] == 2.0
    assert usable_cpus(affinity=set(range(16)), cgroup_root=root, proc_self_cgroup=proc).cores == 2


def test_cgroup_v1_cfs_quota_over_period(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    folder = "cpu,cpuacct/docker/abc"
    write(root, {f"{folder}/cpu.cfs_quota_us": "250000\n", f"{folder}/cpu.cfs_period_us": "100000\n"})
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    assert cgroup_quota(root, proc)[0] == 2.5
    assert usable_cpus(affinity=set(range(4)), cgroup_root=root, proc_self_cgroup=proc).cores == 2


def test_cgroup_v1_quota_minus_one_is_no_limit_and_affinity_caps(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("3:cpu:/\n")
    assert cgroup_quota(root, proc) == (None, "")
    assert usable_cpus(affinity={2, 3, 5}, cgroup_root=root, proc_self_cgroup=proc).cores == 3


def test_nothing_readable_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path / "absent", tmp_path / "absent-proc") == (None, "")
    assert usable_cpus(affinity={0}, cgroup_root=tmp_path, proc_self_cgroup=tmp_path / "x").cores == 1


def cores(n: int) -> UsableCpus:
    return UsableCpus(n, n)


def test_two_cores_one_model_get_a_single_threaded_instance_per_core_and_a_wide_session() -> None:
    plan = plan_threads(cores(2))
    assert (plan.instances, plan.intra_op_threads, plan.wide_threads, plan.spinning, plan.decode_threads) == (
        2, 1, 2, True, 2,
    )  # fmt: skip
    assert plan.reason.startswith(
        "2 usable cores: 2 instances × 1 intra-op thread, a 2-thread wide session for lone requests, spinning on"
    )
    assert plan.computing_threads == 2 and plan.forced == frozenset()  # the wide session never runs beside them


def test_one_core_gets_one_instance_and_no_wide_session() -> None:
    plan = plan_threads(cores(1))
    assert (plan.instances, plan.intra_op_threads, plan.wide_threads, plan.spinning) == (1, 1, 0, True)
    assert "wide" not in plan.reason


def test_the_wide_session_can_be_forced_off_or_on_and_a_gpu_never_gets_one() -> None:
    off = plan_threads(cores(2), wide=False)
    assert (off.instances, off.wide_threads) == (2, 0) and off.forced == frozenset({"wide"})
    assert "2 instances × 1 intra-op thread, no wide session (set), spinning on" in off.reason
    on = plan_threads(cores(4), instances=1, intra_op_threads=2, wide=True)
    assert (on.intra_op_threads, on.wide_threads) == (2, 4) and "a 4-thread wide session for lone requests (set)" in (
        on.reason
    )
    assert plan_threads(cores(4), device_type="cuda").wide_threads == 0
    assert plan_threads(cores(4), device_type="cuda", wide=True).wide_threads == 0
    assert plan_threads(cores(2), instances=1).wide_threads == 0  # one instance has every core already


def test_workers_and_models_share_the_cores() -> None:
    plan = plan_threads(cores(8), workers=2, models=2)
    assert (plan.share, plan.instances, plan.intra_op_threads, plan.decode_threads) == (2, 2, 1, 4)
    assert plan.wide_threads == 2 and plan.computing_threads == 8 and plan.spinning
    assert "shared by 2 workers and 2 model versions: 2 per model" in plan.reason


def test_more_models_than_cores_get_a_thread_each_and_do_not_spin() -> None:
    plan = plan_threads(cores(2), models=3)
    assert (plan.intra_op_threads, plan.spinning) == (1, False)
    assert plan.reason.endswith("3 computing threads on 2 cores: oversubscribed")


def test_settings_force_values_and_the_rest_follows() -> None:
    two = plan_threads(cores(2), instances=2)
    assert (two.instances, two.intra_op_threads, two.spinning) == (2, 1, True)
    assert "2 instances (set) × 1 intra-op thread," in two.reason
    wide = plan_threads(cores(2), intra_op_threads=4)
    assert (wide.intra_op_threads, wide.spinning) == (4, False)  # 4 threads on 2 cores: no spinning
    assert plan_threads(cores(2), intra_op_threads=4, spinning=True).spinning
    assert plan_threads(cores(2), spinning=False).reason.count("spinning off (set)") == 1
    assert plan_threads(cores(2), decode_threads=5).decode_threads == 5


@pytest.mark.parametrize(("n", "threads"), [(1, 4), (2, 2), (3, 1), (4, 1)])
def test_the_tuners_instance_count_divides_the_models_share(n: int, threads: int) -> None:
    plan = plan_threads(cores(4)).with_instances(n)
    assert (plan.instances, plan.intra_op_threads) == (n, threads)
    assert plan_threads(cores(4), instances=1).with_instances(n).instances == 1  # forced: kept


def test_a_gpu_gets_two_instances() -> None:
    assert plan_threads(cores(4), device_type="cuda").instances == 2
