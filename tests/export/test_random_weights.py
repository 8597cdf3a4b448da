"""``python -m export random``: a named ViT config with random weights, exported and proven like any other."""

from __future__ import annotations

import numpy as np
import onnx

from export.__main__ import main
from service.runtime.manifest import load_manifest
from service.runtime.sessions import OrtRunner


def test_a_random_config_exports_with_parity_and_a_manifest_that_says_what_it_is(tmp_path, capsys) -> None:
    out = tmp_path / "repo" / "digits-random" / "1"
    main(["random", "digits", "--to", str(out), "--num-classes", "7", "--seed", "3"])
    assert "parity" in capsys.readouterr().out
    manifest = load_manifest(out / "model.json")
    assert manifest.labels == [f"class_{i}" for i in range(7)]
    assert manifest.input.shape == ["batch", 1, 8, 8] and manifest.preprocessing.color_mode == "L"
    assert manifest.preprocessing.mean == [0.5] and manifest.preprocessing.std == [0.5]
    assert "RANDOM weights" in manifest.description and manifest.provenance.metrics == {}
    assert "torch seed 3" in manifest.provenance.training_data
    diffs = manifest.provenance.export.parity_max_abs_diff
    assert set(diffs) == {"1", "7"} and max(diffs.values()) <= 1e-4
    dims = onnx.load(str(out / "model.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch"
    logits = OrtRunner(out / "model.onnx", device="cpu").run(np.zeros((3, 1, 8, 8), np.float32))["logits"]
    assert logits.shape == (3, 7) and np.isfinite(logits).all()


def test_the_same_seed_gives_the_same_graph(tmp_path) -> None:
    for name in ("a", "b"):
        main(["random", "digits", "--to", str(tmp_path / name / "1"), "--num-classes", "3"])
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    a, b = (OrtRunner(tmp_path / n / "1" / "model.onnx", device="cpu").run(x)["logits"] for n in ("a", "b"))
    np.testing.assert_array_equal(a, b)
