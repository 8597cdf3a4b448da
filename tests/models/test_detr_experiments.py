"""The DETR recipe experiments: the choice by val duplicates, the table, and a resumable smoke run."""

from __future__ import annotations

import json

import pytest
import torch

from models.detr_experiments import RECIPES, REPORTED, choose, main, table, train_flags


def _metrics(duplicates: float, ap: float) -> dict:
    values = {
        f"{split}_{k}": v
        for split in ("val", "test")
        for k, v in {
            "duplicate_canvas_fraction": duplicates,
            "precision": 0.9,
            "recall": 0.95,
            "AP": ap,
            "AP50": 0.97,
        }.items()
    }
    return {**values, "train_cpu_seconds": 100.0, "steps": 50}


def _with(metrics: dict, **values: float) -> dict:
    return {**metrics, **{f"val_{k}": v for k, v in values.items()}}


def test_the_choice_is_by_val_duplicates_first_then_the_margins_over_the_bars() -> None:
    # Under the 2 % bar, the farthest from failing a bar wins (here AP decides); a higher AP with doubles does not.
    results = {"baseline": _metrics(0.24, 0.81), "group11": _metrics(0.01, 0.84), "focal-100q": _metrics(0.004, 0.83)}
    assert choose(results) == "group11"
    # None under the bar: the fewest duplicates, whatever its AP.
    assert choose({"baseline": _metrics(0.24, 0.9), "focal-100q": _metrics(0.05, 0.8)}) == "focal-100q"
    assert choose({}) is None
    # The two finished recipes of 2026-12-06 (val): 0.003 more AP loses to a recall 0.001 from its bar.
    version_2 = _with(_metrics(0.008, 0.875), precision=0.987, recall=0.981, AP50=0.995)
    distorted = _with(_metrics(0.002, 0.872), precision=0.994, recall=0.985, AP50=0.997)
    assert choose({"version-2": version_2, "distorted": distorted}) == "distorted"
    # A recipe under a bar loses to one over every bar, whatever its AP.
    short = _with(_metrics(0.004, 0.90), precision=0.99, recall=0.974, AP50=0.997)
    assert choose({"short": short, "version-2": version_2}) == "version-2"


def test_the_table_marks_the_choice_and_names_the_flags() -> None:
    text = table({"baseline": _metrics(0.24, 0.81), "focal-100q": _metrics(0.004, 0.83)})
    rows = text.splitlines()
    assert len(rows) == 4 and "| focal-100q (chosen) |" in rows[3] and "| 0.4% |" in rows[3]
    assert "`--inputs bucket --class-loss focal --set num_queries=100`" in rows[3]
    assert rows[2].endswith("| 50 | 2.00 |")


def test_every_recipe_is_a_valid_train_detr_command() -> None:
    from models.detr import parse_overrides
    from models.detr_inputs import INPUT_FORMATS
    from models.losses import CLASSIFICATIONS

    for name, options in RECIPES.items():
        assert options.get("class_loss", "softmax") in CLASSIFICATIONS, name
        assert options.get("inputs", "letterbox") in INPUT_FORMATS, name
        flags = train_flags(options).split()
        if "--set" in flags:
            parse_overrides(flags[flags.index("--set") + 1 :])
    assert RECIPES["baseline-letterbox"] == {"inputs": "letterbox"}  # today's recipe, untouched


@pytest.mark.slow
def test_a_smoke_run_resumes_across_sittings_and_writes_the_docs(tmp_path) -> None:
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    argv = ["--run", "focal-50q-group6", "--smoke", "--runs", str(runs), "--docs", str(docs)]
    main([*argv, "--sitting-steps", "3"])  # stops at step 3 of 4
    assert (runs / "focal-50q-group6" / "last.pt").exists() and not (docs / "focal-50q-group6").exists()
    main(argv)  # continues from last.pt to the end
    metrics = json.loads((docs / "focal-50q-group6" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["groups"] == 6 and metrics["class_loss"] == "focal"
    assert (docs / "focal-50q-group6" / "training_curves.png").stat().st_size > 10_000
    checkpoint = torch.load(runs / "focal-50q-group6" / "checkpoint.pt", weights_only=False)
    assert checkpoint["recipe"].startswith("python -m models.detr_experiments --run focal-50q-group6 (= ")
    assert "--class-loss focal --groups 6" in checkpoint["recipe"] and checkpoint["postprocess"] == "sigmoid"
    summary = json.loads((docs / "results.json").read_text())
    assert summary["chosen"] == "focal-50q-group6"
    assert "val_duplicate_canvas_fraction" in summary["recipes"]["focal-50q-group6"]
    text = (docs / "results.md").read_text()
    assert "| focal-50q-group6 (chosen) |" in text and "Not run yet:" in text
    main(argv)  # finished: not trained again
    assert json.loads((docs / "focal-50q-group6" / "metrics.json").read_text()) == metrics


@pytest.mark.slow
def test_a_run_with_no_last_pt_of_its_own_resumes_from_the_committed_sitting(tmp_path) -> None:
    # runs/ is not committed: a sitting that must outlive its session is committed under models/weights/
    from models.detr_experiments import committed_last

    runs, docs, weights = tmp_path / "runs", tmp_path / "docs", tmp_path / "weights"
    argv = ["--run", "baseline", "--smoke", "--runs", str(runs), "--docs", str(docs), "--weights", str(weights)]
    main([*argv, "--sitting-steps", "3"])  # stops at step 3 of 4
    weights.mkdir()
    (runs / "baseline" / "last.pt").rename(committed_last("baseline", weights))  # a new session's checkout
    main([*argv, "--sitting-steps", "1"])
    state = torch.load(runs / "baseline" / "last.pt", weights_only=False)
    assert state["step"] == 4  # resumed at 3, not started again at 0
    main(argv)
    assert json.loads((docs / "baseline" / "metrics.json").read_text())["steps"] == 4


def test_step_seconds_times_full_batches_of_a_recipe() -> None:
    from models.detr_experiments import step_seconds

    timing = step_seconds("group11", steps=1, warmup=0, canvases=24, batch_size=4)
    assert timing["cpu_seconds"] > 0 and timing["wall_seconds"] > 0


def test_the_summary_writes_a_recipe_whose_options_hold_paths(tmp_path) -> None:
    # v2-augmented-digits-ft's options name files (--init, --data): the summary crashed on them once.
    from models.detr_experiments import write_summary

    shown = tmp_path / "v2-augmented-digits-ft"
    shown.mkdir()
    metrics = {k: 0.5 for k in REPORTED} | {"steps": 4000, "train_cpu_seconds": 100.0}
    (shown / "metrics.json").write_text(json.dumps(metrics))
    write_summary(tmp_path)
    written = json.loads((tmp_path / "results.json").read_text())
    options = written["recipes"]["v2-augmented-digits-ft"]["options"]
    assert options["init"].endswith("last.pt") and options["augment_digits"] is True
