"""bench.servers: the contestants waiting for their turn are paused while a point is measured."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bench import servers


def state(pid: int, until: str | None = None) -> str:
    """The process's state letter from /proc/<pid>/stat (``T``: stopped), read until it is ``until``
    (a signal takes effect when the process next runs; 5 s at most: a hang guard, not a timing)."""
    for _ in range(500):
        text = Path(f"/proc/{pid}/stat").read_text()
        letter = text[text.rindex(")") + 2]
        if until is None or (letter == "T") == (until == "T"):
            return letter
        time.sleep(0.01)
    return letter


def test_every_server_but_the_measured_one_is_paused_and_resumed_after(tmp_path: Path) -> None:
    started = {}
    for key in ("measured", "waiting", "also-waiting"):
        process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )  # its own process group, as servers.start makes them
        started[key] = servers.Running(servers.echo(), 0, process, tmp_path / f"{key}.log")
    try:
        with servers.alone(started, "measured") as running:
            assert running is started["measured"] and state(running.process.pid) != "T"
            assert [state(started[k].process.pid, until="T") for k in ("waiting", "also-waiting")] == ["T", "T"]
        assert all(state(r.process.pid, until="running") != "T" for r in started.values())
        started["waiting"].pause()
    finally:
        for running in started.values():
            running.stop(grace=5)  # a paused one is resumed first, so SIGTERM ends it
    assert all(r.process.returncode is not None for r in started.values())
