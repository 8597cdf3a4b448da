"""DETR to ONNX: raw (pred_logits, pred_boxes), a symbolic batch axis, parity at batch 1 and > 1."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

from export.onnx_export import export_onnx, parity
from models.detr import DETRForExport, build
from service.runtime.manifest import load_manifest
from tests.conftest import served_version

pytestmark = pytest.mark.slow
COMMITTED = served_version("detr-digits")


def _graph_io(path) -> tuple[list, list[str]]:
    graph = onnx.load(str(path)).graph
    dims = graph.input[0].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims], [o.name for o in graph.output]


def test_small_detr_exports_with_symbolic_batch_and_parity(tmp_path) -> None:
    torch.manual_seed(0)
    graph = DETRForExport(build("digits-small")).eval()
    path = tmp_path / "model.onnx"
    export_onnx(graph, torch.randn(2, 1, 128, 128), path, output_names=("pred_logits", "pred_boxes"))
    dims, outputs = _graph_io(path)
    assert dims == ["batch", 1, 128, 128] and outputs == ["pred_logits", "pred_boxes"]
    diffs = parity(graph, path, [torch.randn(1, 1, 128, 128), torch.randn(5, 1, 128, 128)])
    assert set(diffs) == {"1", "5"} and max(diffs.values()) <= 1e-4


def test_detr_r50_exports_with_parity(tmp_path) -> None:
    """The paper's DETR-R50 with random weights, at 256x256 to keep CI short (the graph is size-agnostic)."""
    torch.manual_seed(0)
    graph = DETRForExport(build("detr-r50")).eval()
    path = tmp_path / "model.onnx"
    export_onnx(graph, torch.randn(2, 3, 256, 256), path, output_names=("pred_logits", "pred_boxes"))
    dims, outputs = _graph_io(path)
    assert dims == ["batch", 3, 256, 256] and outputs == ["pred_logits", "pred_boxes"]
    diffs = parity(graph, path, [torch.randn(1, 3, 256, 256), torch.randn(2, 3, 256, 256)])
    assert max(diffs.values()) <= 1e-4
    assert path.stat().st_size > 41_000_000 * 4  # every weight is in the one file


def tiny_run(out, **recipe) -> None:
    """A 4-step train_detr run on 16 canvases (val and test 8 each) into ``out``: a checkpoint to export."""
    from models.train_detr import train

    sizes = {"train": 16, "val": 8, "test": 8}
    train(
        out,
        data=None,
        steps=4,
        lr_drop=3,
        warmup_steps=2,
        eval_every=4,
        split_sizes=sizes,
        pretrain_steps=2,
        quiet=True,
        **recipe,
    )


def test_detr_checkpoint_export_end_to_end(tmp_path) -> None:
    from export.checkpoint import export_checkpoint

    tiny_run(tmp_path / "run")
    manifest = export_checkpoint(tmp_path / "run" / "checkpoint.pt", tmp_path / "out", opset=18)
    assert load_manifest(tmp_path / "out" / "model.json") == manifest
    assert manifest.task == "detection"
    assert manifest.input.shape == ["batch", 1, 128, 128]
    assert manifest.outputs == ["pred_logits", "pred_boxes"]
    assert manifest.labels == [*(str(i) for i in range(10)), "no-object"]
    assert manifest.preprocessing.resize == "letterbox"
    assert set(manifest.provenance.export.parity_max_abs_diff) == {"1", "7"}
    assert manifest.provenance.metrics["test_images"] == 8
    assert "models.train_detr" in manifest.provenance.recipe
    assert "Trained on " in manifest.provenance.notes  # the machine (issue 21)
    # Issue 21: what users see at the detect route's default threshold, recorded through ONNX Runtime.
    from export.detr import onnx_runner
    from models.detection_data import load_split, to_coco
    from models.detection_eval import detect_images, set_quality

    test = load_split("test", None, 8)
    detections = detect_images(
        onnx_runner(tmp_path / "out" / "model.onnx"), [c.image for c in test], manifest.preprocessing, manifest.labels
    )
    quality = set_quality(to_coco(test), detections, threshold=0.5)
    metrics = manifest.provenance.metrics
    assert metrics["set_quality_threshold"] == 0.5
    for key in ("duplicate_canvas_fraction", "duplicate_pairs", "precision", "recall"):
        assert metrics[f"test_{key}"] == pytest.approx(quality[key], abs=1e-12), key
    assert 0 <= metrics["test_precision"] <= 1 and 0 <= metrics["test_recall"] <= 1


def test_committed_detr_manifest_records_parity_and_the_ap_it_measures() -> None:
    """The served detr-digits (issues 18 and 21; version 4: version 3's export, its scores Platt-scaled on
    val): a masked, bucketed graph whose manifest's AP, duplicates, precision and recall this test
    recomputes through ONNX Runtime."""
    from export.detr import onnx_runner
    from models.detection_data import load_split, to_coco
    from models.detection_eval import coco_ap, detect_images, served_rule, set_quality

    manifest = load_manifest(COMMITTED / "model.json")
    metrics = manifest.provenance.metrics
    assert manifest.task == "detection" and manifest.preprocessing.resize == "shortest_edge"
    assert manifest.pixel_mask == "pixel_mask" and len(manifest.preprocessing.buckets or []) >= 2  # issue 18
    assert set(manifest.provenance.export.parity_max_abs_diff) == {"1", "7"}
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    assert "detr_experiments" in manifest.provenance.recipe and "Trained on " in manifest.provenance.notes
    test = load_split("test", None, int(metrics["test_images"]))
    detections = detect_images(
        onnx_runner(COMMITTED / "model.onnx"),
        [c.image for c in test],
        manifest.preprocessing,
        manifest.labels,
        postprocess=served_rule(manifest),
    )
    measured = coco_ap(to_coco(test), detections)
    # Not to the last bit: ONNX Runtime's scores differ in their last float32 bits from one CPU to another
    # (on the VM of 2026-12-07 21:15 UTC the AP came to 0.86931446 against the committed 0.86931449).
    assert measured["AP"] == pytest.approx(metrics["test_AP"], abs=1e-6)
    assert measured["AP50"] == pytest.approx(metrics["test_AP50"], abs=1e-9)
    quality = set_quality(to_coco(test), detections, threshold=metrics["set_quality_threshold"])
    for key in ("duplicate_canvas_fraction", "duplicate_pairs", "precision", "recall", "missed"):
        assert quality[key] == pytest.approx(metrics[f"test_{key}"], abs=1e-12), key
    assert quality["missed_scored_below_threshold"] == metrics["test_missed_scored_below_threshold"]
    # Issue 21's bars: AP >= 0.85, AP50 >= 0.98, duplicates on < 2 % of canvases, precision >= 0.97, and
    # recall >= 0.98 (version 3, uncalibrated, missed it at 0.976: docs/detr-recipe.md, "Calibrated scores").
    assert measured["AP"] >= 0.85 and measured["AP50"] >= 0.98
    assert quality["duplicate_canvas_fraction"] < 0.02 and quality["precision"] >= 0.97
    assert quality["recall"] >= 0.98
    trained = json.loads((COMMITTED / "metrics.json").read_text())
    assert trained["test_AP"] == pytest.approx(metrics["test_AP_pytorch"])
    assert abs(trained["test_AP"] - metrics["test_AP"]) < 0.005  # PyTorch and ONNX Runtime agree


@pytest.mark.slow
def test_export_random_writes_a_detr_r50_the_server_can_load(tmp_path) -> None:
    from export.random_weights import export_random

    manifest = export_random("detr-r50", tmp_path / "detr-r50-random" / "1", opset=18)
    assert manifest.task == "detection" and manifest.outputs == ["pred_logits", "pred_boxes"]
    assert len(manifest.labels) == 92 and manifest.labels[-1] == "no-object"
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    assert load_manifest(tmp_path / "detr-r50-random" / "1" / "model.json") == manifest


def test_a_bucketed_focal_detr_checkpoint_exports_with_a_pixel_mask_and_serves_over_http(tmp_path) -> None:
    """Issue 18 + 21: a checkpoint trained with --inputs bucket --class-loss focal exports a graph with
    pixel_mask, the fit policy and buckets, the sigmoid score rule; the server loads it and detects."""
    import asyncio

    import httpx
    import numpy as np

    from export.checkpoint import export_checkpoint
    from tests.conftest import png_bytes, running_app

    tiny_run(tmp_path / "run", class_loss="focal", inputs="bucket")
    out = tmp_path / "repository" / "detr-bucketed" / "1"
    manifest = export_checkpoint(tmp_path / "run" / "checkpoint.pt", out, opset=18)
    assert load_manifest(out / "model.json") == manifest
    assert manifest.input.shape == ["batch", 1, "height", "width"] and manifest.pixel_mask == "pixel_mask"
    assert manifest.preprocessing.resize == "fit" and manifest.preprocessing.longest_edge == 128
    assert [(b.height, b.width) for b in manifest.preprocessing.buckets or []] == [
        (96, 96),
        (96, 128),
        (128, 96),
        (128, 128),
    ]
    assert manifest.labels == [str(i) for i in range(10)]  # sigmoid: no "no object" class
    assert manifest.task_options == {"scores": "sigmoid_top_k", "top_k": 100, "box_format": "cxcywh"}
    diffs = manifest.provenance.export.parity_max_abs_diff
    assert set(diffs) == {"1", "7"} and max(diffs.values()) <= 1e-4

    async def detect() -> httpx.Response:
        pixels = np.zeros((70, 110), np.uint8)
        pixels[20:50, 30:60] = 255
        async with running_app(model_repository=tmp_path / "repository") as client:
            return await client.post(
                "/v1/models/detr-bucketed/detect",
                content=png_bytes(pixels),
                headers={"content-type": "image/png"},
                params={"threshold": 0, "max_detections": 5},
            )

    response = asyncio.run(detect())
    assert response.status_code == 200, response.text
    assert len(response.json()["detections"]) == 5 and "pad;dur=" in response.headers["server-timing"]


def test_a_fixed_frame_detr_exports_with_parity_and_its_boxes_ignore_the_bucket(tmp_path) -> None:
    """fixed_frame on resized-served inputs (issue 21's resized-served-frame recipe): the valid extent is
    measured from pixel_mask in the graph, so ONNX Runtime gives an image the same boxes in two buckets."""
    import numpy as np
    import onnxruntime as ort

    from export.checkpoint import export_checkpoint

    tiny_run(tmp_path / "run", inputs="resized-served", overrides={"fixed_frame": 128})
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["config"]["fixed_frame"] == 128
    out = tmp_path / "repository" / "detr-framed" / "1"
    manifest = export_checkpoint(tmp_path / "run" / "checkpoint.pt", out, opset=18)
    assert manifest.pixel_mask == "pixel_mask" and manifest.preprocessing.resize == "shortest_edge"
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).random((1, 1, 128, 96), dtype=np.float32)
    boxes = []
    for width in (96, 128):
        padded = np.zeros((1, 1, 128, width), np.float32)
        padded[..., :96] = image
        mask = np.zeros((1, 128, width), np.int64)
        mask[..., :96] = 1
        boxes.append(session.run(["pred_boxes"], {"pixel_values": padded, "pixel_mask": mask})[0])
    np.testing.assert_allclose(boxes[1], boxes[0], atol=1e-3)
