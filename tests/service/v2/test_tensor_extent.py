"""/v2 infer on graphs of symbolic H and W without padding buckets: the input capped by the resize policy.

A detector whose manifest has a ``pixel_mask`` but no buckets pads each row's real pixels to the
tensor's own H x W; a graph without a mask runs each row whole. Either way a tensor larger than
the model's preprocessing ever makes (the resize policy's ``bounds``) is a 400 and never run: its
cost grows with H x W (detr-digits version 2 took 2.9 s and 3.4 GB for 1024x1024).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from prometheus_client import REGISTRY

from tests.conftest import MODEL_REPOSITORY, running_app

pytestmark = pytest.mark.anyio


def _request(x: np.ndarray, mask: np.ndarray | None = None) -> dict:
    inputs = [{"name": "pixel_values", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    if mask is not None:
        inputs.append(
            {"name": "pixel_mask", "shape": list(mask.shape), "datatype": "INT64", "data": mask.ravel().tolist()}
        )
    return {"inputs": inputs}


def _runs(model: str) -> float:
    return REGISTRY.get_sample_value("patchserve_batch_size_count", {"model": model, "version": "1"}) or 0.0


@pytest.fixture
def unbucketed_detr(tmp_path: Path) -> Path:
    """detr-digits version 2 as version 1 of ``detr-exact``, its manifest without ``preprocessing.buckets``."""
    folder = tmp_path / "repository" / "detr-exact" / "1"
    shutil.copytree(MODEL_REPOSITORY / "detr-digits" / "2", folder)
    manifest = json.loads((folder / "model.json").read_text())
    manifest["preprocessing"]["buckets"] = None
    (folder / "model.json").write_text(json.dumps(manifest))
    return tmp_path / "repository"


async def test_a_masked_detector_without_buckets_caps_the_tensor_at_its_resize_bounds(unbucketed_detr: Path) -> None:
    url = "/v2/models/detr-exact/infer"
    big = np.zeros((1, 1, 1024, 1024), np.float32)
    mask = np.zeros((1, 1024, 1024), np.int64)
    mask[0, :64, :64] = 1
    fits = np.zeros((2, 1, 128, 96), np.float32)
    fits_mask = np.ones((2, 128, 96), np.int64)
    fits_mask[1, 100:, :] = 0
    async with running_app(model_repository=unbucketed_detr) as client:
        before = _runs("detr-exact")
        refused = await client.post(url, json=_request(big, mask))
        after_refusal = _runs("detr-exact")
        served = await client.post(url, json=_request(fits, fits_mask))
    assert refused.status_code == 400, refused.text
    assert "1024x1024" in refused.json()["error"] and "at most" in refused.json()["error"]
    assert after_refusal == before  # never run
    assert served.status_code == 200, served.text
    shapes = {o["name"]: o["shape"] for o in served.json()["outputs"]}
    assert shapes["pred_boxes"][:1] == [2] and shapes["pred_boxes"][-1] == 4


def _mean_classifier(path: Path) -> None:
    """A graph of symbolic H and W and no mask: (B, 1, H, W) -> its mean times 1..10 as (B, 10) logits."""
    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 1, "height", "width"])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    weights = helper.make_tensor("weights", TensorProto.FLOAT, [1, 10], [float(i) for i in range(1, 11)])
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixel_values", "axes"], ["mean"], keepdims=0),
            helper.make_node("MatMul", ["mean", "weights"], ["logits"]),
        ],
        "mean_classifier",
        [x],
        [y],
        [weights, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)


@pytest.fixture
def dynamic_classifier(tmp_path: Path) -> Path:
    folder = tmp_path / "repository" / "mean-classifier" / "1"
    folder.mkdir(parents=True)
    _mean_classifier(folder / "model.onnx")
    manifest = json.loads((MODEL_REPOSITORY / "vit-digits" / "1" / "model.json").read_text())
    manifest["description"] = "a test graph: the mean of the image times 1..10"
    manifest["input"]["shape"] = ["batch", 1, "height", "width"]
    manifest["outputs"], manifest["roles"] = ["logits"], {"logits": "logits"}
    manifest["preprocessing"].update(resize="shortest_edge", size=None, shortest_edge=16, longest_edge=32)
    manifest["provenance"].update(recipe="built by tests/service/v2/test_tensor_extent.py", metrics={})
    (folder / "model.json").write_text(json.dumps(manifest))
    return tmp_path / "repository"


async def test_a_graph_of_any_size_without_a_mask_caps_the_tensor_at_its_resize_bounds(
    dynamic_classifier: Path,
) -> None:
    url = "/v2/models/mean-classifier/infer"
    async with running_app(model_repository=dynamic_classifier) as client:
        before = _runs("mean-classifier")
        refused = await client.post(url, json=_request(np.ones((1, 1, 33, 16), np.float32)))
        after_refusal = _runs("mean-classifier")
        served = await client.post(url, json=_request(np.full((1, 1, 32, 16), 0.5, np.float32)))
    assert refused.status_code == 400, refused.text
    assert "33x16" in refused.json()["error"] and "at most" in refused.json()["error"]
    assert after_refusal == before
    assert served.status_code == 200, served.text
    (logits,) = served.json()["outputs"]
    np.testing.assert_allclose(logits["data"], [0.5 * i for i in range(1, 11)], rtol=1e-6)
