"""bench/loop_cpu.py: it drives the real app (and the naive one) in process and reports every round."""

from __future__ import annotations

import re

import pytest

from bench import loop_cpu
from tests.conftest import ROOT

DIGIT = ROOT / "examples" / "digit-7.png"


@pytest.mark.parametrize("naive", [False, True])
def test_it_reports_each_rounds_cpu_per_request(capsys: pytest.CaptureFixture[str], naive: bool) -> None:
    argv = ["--model", "vit-digits", "--image", str(DIGIT), "--requests", "4", "--rounds", "2", "--warm-up", "1"]
    loop_cpu.main(argv + (["--naive"] if naive else []))
    line = r"^round (\d): event loop ([\d.]+) ms CPU per request, process ([\d.]+) ms CPU, wall ([\d.]+) ms$"
    rounds = re.findall(line, capsys.readouterr().out, re.MULTILINE)
    assert [r[0] for r in rounds] == ["1", "2"]
    for _, loop, process, wall in rounds:
        assert 0 < float(loop) <= float(process) and float(wall) > 0  # the loop's thread is one of the process's


def test_the_body_is_one_image_part_curl_would_send() -> None:
    from python_multipart.multipart import parse_options_header

    body = loop_cpu.multipart(b"\x89PNG...", "a.png")
    assert body.startswith(b"--" + loop_cpu.BOUNDARY + b"\r\n") and body.endswith(b"--" + loop_cpu.BOUNDARY + b"--\r\n")
    disposition = body.split(b"\r\n")[1].split(b": ", 1)[1]
    assert parse_options_header(disposition) == (b"form-data", {b"name": b"image", b"filename": b"a.png"})
    assert b"Content-Type: image/png\r\n\r\n\x89PNG...\r\n" in body
