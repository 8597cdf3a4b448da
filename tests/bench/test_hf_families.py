"""bench/hf_families.py's table: loaded figures are marked as such, and the docs page is rewritten between markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hf_families import BEGIN, END, Row, Timing, table, write_docs


def row(loaded: str) -> Row:
    return Row(
        preset="swin-tiny-patch4-window7-224",
        architecture="SwinForImageClassification",
        parameters_m=28.3,
        input="224×224",
        parity={"1": 1.2e-6, "4": 2.5e-6},
        export_seconds=41.4,
        export_foreign_cores=0.02,
        timings=[Timing(1, 12, 30.25, 29.0, 35.5, 0.01, ""), Timing(4, 10, 20.0, 19.5, 22.0, 0.9, loaded)],
    )


def test_a_quiet_figure_is_plain_and_a_loaded_one_says_so() -> None:
    text = table([row("foreign processes took 0.90 cores")])
    line = text.splitlines()[2]
    assert line.startswith("| `swin-tiny-patch4-window7-224` | `SwinForImageClassification` | 28.3M | 224×224 | 41 |")
    assert "| 30.2 (29.0–35.5) |" in line  # batch 1, quiet: no mark
    assert "20.0 (19.5–22.0) *loaded: 0.90 foreign cores*" in line
    assert line.endswith("| 1.2e-06 / 2.5e-06 |")


def test_the_docs_table_is_replaced_between_the_markers_only(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{BEGIN}\nold table\n{END}\nafter\n")
    write_docs(page, "new table")
    assert page.read_text() == f"intro\n{BEGIN}\nnew table\n{END}\nafter\n"
    (tmp_path / "bare.md").write_text("no markers")
    with pytest.raises(SystemExit, match="markers"):
        write_docs(tmp_path / "bare.md", "x")
