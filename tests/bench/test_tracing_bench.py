"""bench/tracing.py's arithmetic and its OTLP sink (the benchmark itself runs on a quiet machine, not here)."""

from __future__ import annotations

import httpx
import pytest

from bench.tracing import main, otlp_sink, overhead, summary


def test_overhead_is_the_median_of_each_valid_rounds_throughput_loss() -> None:
    def rounds(*pairs: tuple[float, float, bool]) -> list[dict]:
        return [{"valid": v, "off": {"throughput": off}, "on": {"throughput": on}} for off, on, v in pairs]

    measured = rounds((100.0, 98.0, True), (100.0, 90.0, False), (200.0, 194.0, True), (50.0, 49.5, True))
    assert overhead(measured) == pytest.approx({"median": 0.02, "min": 0.01, "max": 0.03})
    assert overhead(rounds((100.0, 90.0, False))) is None
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}


def test_the_sink_accepts_an_export() -> None:
    with otlp_sink() as url:
        response = httpx.post(
            url + "/v1/traces", content=b"\x0a\x00", headers={"Content-Type": "application/x-protobuf"}
        )
    assert response.status_code == 200


def test_help_names_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "vit-cifar10" in capsys.readouterr().out
