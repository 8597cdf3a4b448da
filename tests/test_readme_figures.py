"""The README's model figures are the manifests' (what export measured), and its example answer is the picture's."""

from __future__ import annotations

import json
import re

from service.runtime.manifest import load_manifest
from tests.conftest import ROOT, served_version

README = (ROOT / "README.md").read_text()


def _row(model: str) -> str:
    (row,) = [line for line in README.splitlines() if line.startswith(f"| `{model}` |")]
    return row


def test_the_detector_row_quotes_its_manifest() -> None:
    metrics = load_manifest(served_version("detr-digits") / "model.json").provenance.metrics
    row = _row("detr-digits")
    assert f"COCO AP {metrics['test_AP']:.3f}" in row and f"AP50 {metrics['test_AP50']:.3f}" in row
    assert f"doubles on {100 * metrics['test_duplicate_canvas_fraction']:.1f} % of canvases" in row
    assert f"precision {metrics['test_precision']:.3f}" in row and f"recall {metrics['test_recall']:.3f}" in row
    first = load_manifest(ROOT / "model_repository" / "detr-digits" / "1" / "model.json").provenance.metrics
    assert f"version 1: AP {first['test_AP']:.3f}" in row


def test_the_classifier_rows_quote_their_manifests() -> None:
    for model, key in (("vit-digits", "test_accuracy"), ("vit-cifar10", "test_accuracy")):
        metrics = load_manifest(served_version(model) / "model.json").provenance.metrics
        assert f"accuracy {metrics[key]:.4f}" in _row(model), model


def test_the_example_detection_is_the_committed_answer() -> None:
    (shown,) = re.findall(r'^\{"model":"detr-digits".*$', README, re.MULTILINE)
    answer = json.loads((ROOT / "examples" / "canvas.detr-digits.json").read_text())
    first = answer["detections"][0]
    assert f'"version":"{answer["version"]}"' in shown and f'"score":{first["score"]!r}' in shown
    assert f'"xmin":{first["box"]["xmin"]!r}' in shown
