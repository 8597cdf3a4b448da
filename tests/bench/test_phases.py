"""bench.phases: blocks of one- and two-thread runs, and the summary that counts the slow ones.

Runs the committed vit-digits graph for a few runs; figures are compared with each other, never
with a wall-clock bound.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import phases

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "model_repository" / "vit-digits" / "1" / "model.onnx"


def test_summary_counts_the_blocks_over_the_bound_of_the_fastest() -> None:
    summary = phases.summarise([28.1, 28.4, 27.9], [16.0, 25.3, 16.2, 25.1], [[27.7, 28.0]], slow=1.25)
    assert summary["two_threads_ms"] == [16.0, 25.3]
    assert (summary["slow_blocks"], summary["blocks"]) == (2, 4)
    assert summary["slow_block_median_ms"] == pytest.approx(25.2)
    assert summary["one_thread_ms"] == [27.9, 28.4]
    assert summary["side_by_side_ms"] == [27.7, 28.0]


def test_steady_blocks_have_no_slow_one_and_no_side_by_side_without_pairs() -> None:
    summary = phases.summarise([1.0], [2.0, 2.4], [], slow=1.25)
    assert (summary["slow_blocks"], summary["slow_block_median_ms"], summary["side_by_side_ms"]) == (0, None, None)


def test_a_short_run_prints_every_block_and_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    phases.main(["--model", str(MODEL), "--blocks", "2", "--runs", "3", "--every", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["block   1", "block   2"]
    summary = json.loads(lines[-1].split(": ", 1)[1])
    assert summary["blocks"] == 2 and 0 <= summary["slow_blocks"] <= 2
    assert all(t > 0 for t in summary["two_threads_ms"] + summary["one_thread_ms"])
    if len(os.sched_getaffinity(0)) >= 2:  # the check after every second block, in two pinned processes
        assert "side by side, CPU " in lines[1]
        assert all(t > 0 for t in summary["side_by_side_ms"])
    else:
        assert summary["side_by_side_ms"] is None


def test_blocks_and_runs_must_be_at_least_one() -> None:
    for flag in ("--blocks", "--runs"):
        with pytest.raises(SystemExit):
            phases.main(["--model", str(MODEL), flag, "0"])
