"""Export to ONNX: parity with PyTorch at batch 1 and 7, a symbolic batch axis, the manifest."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from export import evaluate
from export.onnx_export import ParityError, export_onnx, parity
from models.vit import build
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY

COMMITTED = MODEL_REPOSITORY / "vit-digits" / "1"


def test_random_vit_exports_with_symbolic_batch_and_parity(tmp_path) -> None:
    torch.manual_seed(0)
    model = build("digits").eval()
    path = tmp_path / "model.onnx"
    export_onnx(model, torch.randn(2, 1, 8, 8), path)
    graph = onnx.load(str(path))
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [1, 8, 8]
    assert graph.graph.output[0].name == "logits"
    diffs = parity(model, path, [torch.randn(1, 1, 8, 8), torch.randn(7, 1, 8, 8)])
    assert set(diffs) == {"1", "7"} and max(diffs.values()) <= 1e-4


def test_parity_fails_loudly_when_the_graph_differs(tmp_path) -> None:
    torch.manual_seed(0)
    model = build("digits").eval()
    path = tmp_path / "model.onnx"
    export_onnx(model, torch.randn(2, 1, 8, 8), path)
    with torch.no_grad():
        model.head.bias.add_(1.0)  # PyTorch now differs from the exported graph
    with pytest.raises(ParityError, match="batch 1"):
        parity(model, path, [torch.randn(1, 1, 8, 8)])


def test_committed_manifest_records_parity_and_accuracy(digits_test_split) -> None:
    manifest = load_manifest(COMMITTED / "model.json")
    assert set(manifest.provenance.export.parity_max_abs_diff) == {"1", "7"}
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    recomputed = evaluate.accuracy(COMMITTED / "model.onnx", manifest.preprocessing, digits_test_split)
    assert recomputed == manifest.provenance.metrics["test_accuracy"] >= 0.96
    assert json.loads((COMMITTED / "metrics.json").read_text())["test_accuracy"] == pytest.approx(
        manifest.provenance.metrics["test_accuracy_pytorch"]
    )
    predictions = evaluate.predict(COMMITTED / "model.onnx", manifest.preprocessing, digits_test_split.images[:10])
    assert predictions.dtype.kind == "i" and np.all((predictions >= 0) & (predictions < 10))


@pytest.mark.slow
def test_checkpoint_export_end_to_end(tmp_path) -> None:
    from export.checkpoint import export_checkpoint
    from models.train_digits import train

    train(tmp_path / "run", steps=60, quiet=True)
    manifest = export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "out", opset=18)
    assert load_manifest(tmp_path / "out" / "model.json") == manifest
    assert manifest.input.shape == ["batch", 1, 8, 8]
    assert manifest.labels == [str(i) for i in range(10)]
    assert "models.train_digits" in manifest.provenance.recipe
    assert 0.0 <= manifest.provenance.metrics["test_accuracy"] <= 1.0
