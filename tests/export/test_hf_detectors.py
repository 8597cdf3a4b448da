"""The DETR family imported from transformers checkpoints (export/hf_detectors.py): registration, processors,
refusals, and the parity suite (ONNX Runtime vs transformers; the server's JSON vs transformers' processor +
model + post_process_object_detection on real photos).

Random weights put sigmoid scores near 0.5 and make near-ties common, so detections are matched
tie-tolerantly: the same scores in order (within 1e-4), and the same set of (label, box within 0.5 px)
among detections whose scores lie within 1e-4 of each other; only at the cut-off score (the lowest kept)
may the two sides hold different members of a tie.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from export.hf import HEADS, TASKS, ImportRefused, export_hf, labels_from_config, preprocessing_from_processor
from export.hf_detectors import FAMILIES
from export.hf_presets import PRESETS
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import Size, load_manifest
from service.tasks.detection_scores import RULES
from tests.conftest import MODEL_REPOSITORY, ROOT, running_app
from tests.export.hf_helpers import import_presets, transformers_model

PHOTOS = ROOT / "tests" / "images" / "skimage"
# preset -> (architecture, score rule, top_k written in the manifest)
FAMILY_PRESETS = {
    "tiny-yolos": ("YolosForObjectDetection", "softmax", None),
    "tiny-conditional-detr": ("ConditionalDetrForObjectDetection", "sigmoid_top_k", 100),
    "tiny-deformable-detr": ("DeformableDetrForObjectDetection", "sigmoid_top_k", 100),
    "tiny-rtdetr": ("RTDetrForObjectDetection", "sigmoid_top_k", None),
    "tiny-rtdetr-v2": ("RTDetrV2ForObjectDetection", "sigmoid_top_k", None),
    "tiny-dfine": ("DFineForObjectDetection", "sigmoid_top_k", None),
    "tiny-lwdetr": ("LwDetrForObjectDetection", "sigmoid_top_k", 100),
    "tiny-rfdetr": ("RfDetrForObjectDetection", "sigmoid_top_k", None),
}
SUPPORTED = list(FAMILY_PRESETS)


def photo(name: str) -> Image.Image:
    return Image.open(PHOTOS / name).convert("RGB")


def image_processor(preset: str, folder: Path):
    """transformers' image processor of the preset (the PIL backend: torchvision cannot be installed here).

    RF-DETR's ``RfDetrImageProcessor`` exists only on torchvision; its resize, rescale and normalise and
    its ``post_process_object_detection`` (sigmoid, top-k over queries x classes, ``top_k`` = queries) are
    those of Deformable DETR's processor, which stands in for it.
    """
    from transformers import AutoImageProcessor, DeformableDetrImageProcessorPil

    processor = json.loads((folder / "preprocessor_config.json").read_text())
    if processor["image_processor_type"] == "RfDetrImageProcessor":
        return DeformableDetrImageProcessorPil(**{k: v for k, v in processor.items() if k != "image_processor_type"})
    return AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)


def test_every_family_is_registered_with_its_processors_post_processing() -> None:
    assert {family.architecture for family in FAMILIES} == {arch for arch, _, _ in FAMILY_PRESETS.values()}
    for preset, (architecture, scores, top_k) in FAMILY_PRESETS.items():
        config = PRESETS[preset][0]
        head = HEADS[architecture]
        assert config["architectures"] == [architecture] and TASKS[architecture] == head.task
        assert head.task_options(config) == {"scores": scores, "top_k": top_k, "box_format": "cxcywh"}
        labels = labels_from_config(config, head)
        assert RULES[scores].no_object == (labels[-1] == "no-object"), preset
        assert labels[:3] == ["cat", "dog", "cup"]


@pytest.mark.parametrize("preset", SUPPORTED)
def test_the_processor_config_maps_onto_the_manifest(preset: str) -> None:
    architecture = FAMILY_PRESETS[preset][0]
    spec = preprocessing_from_processor(PRESETS[preset][1], HEADS[architecture])
    size = PRESETS[preset][1]["size"]
    if "height" in size:  # RT-DETR, D-FINE, LW-DETR, RF-DETR, Deformable DETR: one size, stretched
        assert spec.resize == "stretch" and spec.size == Size(**size)
    else:
        assert (spec.resize, spec.shortest_edge, spec.longest_edge) == ("shortest_edge", 64, 96)
    if preset.startswith(("tiny-rtdetr", "tiny-dfine")):  # RT-DETR's processor does not normalise
        assert spec.mean == [0.0] * 3 and spec.std == [1.0] * 3
    else:
        assert spec.mean == [0.485, 0.456, 0.406] and spec.std == [0.229, 0.224, 0.225]
    assert spec.interpolation == "bilinear" and spec.scale == pytest.approx(1 / 255) and spec.crop_size is None


def test_rtdetrs_default_size_is_its_processors_640_square() -> None:
    spec = preprocessing_from_processor({"do_normalize": False}, HEADS["RTDetrForObjectDetection"])
    assert spec.resize == "stretch" and spec.size == Size(height=640, width=640)
    with pytest.raises(ImportRefused, match="max_height"):
        preprocessing_from_processor({"size": {"max_height": 640}}, HEADS["RTDetrForObjectDetection"])


@pytest.mark.parametrize("preset", SUPPORTED)
def test_served_preprocessing_equals_the_familys_image_processor(tmp_path: Path, preset: str) -> None:
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRESETS[preset][1]))
    processor = image_processor(preset, tmp_path)
    ours = Preprocessor(preprocessing_from_processor(PRESETS[preset][1], HEADS[FAMILY_PRESETS[preset][0]]))
    for name in ("chelsea.png", "astronaut.png", "coffee.png"):
        theirs = processor(images=photo(name), return_tensors="np")["pixel_values"][0]
        mine = ours(photo(name))
        assert mine.shape == theirs.shape and float(np.max(np.abs(mine - theirs))) <= 1e-5, (preset, name)


def test_an_unsupported_architecture_is_named_with_the_supported_ones(tmp_path: Path, capsys) -> None:
    from export.__main__ import main

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DabDetrForObjectDetection"]}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRESETS["tiny-rtdetr"][1]))
    with pytest.raises(SystemExit) as exited:
        main(["hf", str(tmp_path), "--to", str(tmp_path / "out")])
    message = capsys.readouterr().err
    assert exited.value.code == 2 and "DabDetrForObjectDetection" in message
    for _, (architecture, _, _) in FAMILY_PRESETS.items():
        assert architecture in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("architecture", ["ConditionalDetrForObjectDetection", "DeformableDetrForObjectDetection"])
def test_a_timm_backbone_is_refused_naming_the_reason(tmp_path: Path, architecture: str) -> None:
    config = {"architectures": [architecture], "use_timm_backbone": True, "backbone": "resnet50"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRESETS["tiny-deformable-detr"][1]))
    with pytest.raises(ImportRefused, match=r"timm backbone.*'resnet50'.*torchvision.*use_timm_backbone=false"):
        export_hf(tmp_path, tmp_path / "out", opset=18)
    assert not (tmp_path / "out").exists()


def test_a_deformable_detr_with_a_shortest_edge_processor_is_refused_naming_the_operator(tmp_path: Path) -> None:
    config, processor = PRESETS["deformable-detr"]  # the hub's form: transformers' ResNet-50, shortest edge 800
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(ImportRefused, match=r"size .*shortest_edge.*dynamic height and width.*torch\.as_tensor"):
        export_hf(tmp_path, tmp_path / "out", opset=18)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def detectors(tmp_path_factory) -> Path:
    """Every supported family's tiny preset, built offline and imported, in one model repository."""
    return import_presets(tmp_path_factory.mktemp("detectors"), SUPPORTED)


@pytest.mark.slow
@pytest.mark.parametrize("preset", SUPPORTED)
def test_onnx_runtime_equals_transformers_at_batch_1_and_3(detectors: Path, preset: str) -> None:
    folder, out = detectors / "checkpoints" / preset, detectors / "repository" / preset / "1"
    manifest = load_manifest(out / "model.json")
    architecture, scores, top_k = FAMILY_PRESETS[preset]
    assert manifest.task_options == {"scores": scores, "top_k": top_k, "box_format": "cxcywh"}
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= 1e-4
    assert manifest.outputs == ["pred_logits", "pred_boxes"] and architecture in manifest.description

    preprocess = Preprocessor(manifest.preprocessing)
    cat = photo("chelsea.png")
    images = [cat, cat.transpose(Image.Transpose.FLIP_LEFT_RIGHT), cat.transpose(Image.Transpose.ROTATE_180)]
    batch = np.stack([preprocess(image) for image in images])  # (3, 3, H, W), one size: one batch
    model = transformers_model(folder)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for pixel_values in (batch[:1], batch):
        with torch.no_grad():
            expected = model(pixel_values=torch.from_numpy(pixel_values))
        logits, boxes = session.run(None, {"pixel_values": pixel_values})
        assert logits.shape == tuple(expected.logits.shape) and boxes.shape[-1] == 4
        assert float(np.max(np.abs(logits - expected.logits.numpy()))) <= 1e-4, (preset, len(pixel_values))
        assert float(np.max(np.abs(boxes - expected.pred_boxes.numpy()))) <= 1e-4, (preset, len(pixel_values))


def reference_detections(preset: str, folder: Path, image: Image.Image, top_k: int | None) -> list[dict]:
    """transformers' processor + model + ``post_process_object_detection`` at threshold 0, boxes clipped."""
    processor, model = image_processor(preset, folder), transformers_model(folder)
    inputs = processor(images=image, return_tensors="pt")
    with torch.no_grad():
        outputs = model(pixel_values=inputs["pixel_values"])
    kwargs = {} if top_k is None else {"top_k": top_k}
    if preset == "tiny-rfdetr":  # RF-DETR's processor: top_k = the number of queries
        kwargs = {"top_k": outputs.logits.shape[1]}
    (result,) = processor.post_process_object_detection(
        outputs, threshold=0.0, target_sizes=[(image.height, image.width)], **kwargs
    )
    labels = model.config.id2label
    width, height = image.size
    return [
        {
            "label": labels[int(label)],
            "score": float(score),
            "box": np.clip(box.numpy(), 0, [width, height, width, height]),  # the server clips to the image
        }
        for score, label, box in zip(result["scores"], result["labels"], result["boxes"], strict=True)
    ]


def assert_same_detections(served: list[dict], expected: list[dict], what: str) -> None:
    """Tie-tolerant: scores in order within 1e-4; per score tie, the same (label, box within 0.5 px)."""
    expected = sorted(expected, key=lambda d: -d["score"])
    assert len(served) == len(expected), what
    np.testing.assert_allclose([d["score"] for d in served], [d["score"] for d in expected], atol=1e-4, err_msg=what)
    cutoff = expected[-1]["score"] if expected else 0.0
    for d in served:
        if d["score"] <= cutoff + 1e-4:
            continue  # a tie at the cut-off: either side may hold a different member of it
        box = np.array([d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")])
        assert any(
            e["label"] == d["label"] and abs(e["score"] - d["score"]) <= 1e-4 and np.max(np.abs(e["box"] - box)) <= 0.5
            for e in expected
        ), (what, d)


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_servers_json_equals_transformers_post_processing_on_photos(detectors: Path) -> None:
    import shutil

    repository = detectors / "repository"
    shutil.copytree(MODEL_REPOSITORY / "detr-digits", repository / "detr-digits", dirs_exist_ok=True)
    names = ("chelsea.png", "coffee.png", "astronaut.png")
    async with running_app(model_repository=repository) as client:
        for preset in SUPPORTED:
            top_k = FAMILY_PRESETS[preset][2]
            for name in names:
                payload = (PHOTOS / name).read_bytes()
                response = await client.post(
                    f"/v1/models/{preset}/detect?threshold=0&max_detections=1000", files={"image": payload}
                )
                assert response.status_code == 200, response.text
                body = response.json()
                assert body["image"] == dict(zip(("width", "height"), photo(name).size, strict=True))
                expected = reference_detections(preset, detectors / "checkpoints" / preset, photo(name), top_k)
                assert len(expected) > 0
                assert_same_detections(body["detections"], expected, f"{preset} {name}")
        # the committed softmax DETR is served beside them, its manifest unchanged (no task_options)
        digits = await client.post(
            "/v1/models/detr-digits/detect", files={"image": (ROOT / "examples" / "canvas.png").read_bytes()}
        )
        assert digits.status_code == 200 and len(digits.json()["detections"]) > 0


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_bad_image_to_a_sigmoid_detector_is_a_4xx(detectors: Path) -> None:
    async with running_app(model_repository=detectors / "repository") as client:
        response = await client.post("/v1/models/tiny-rtdetr/detect", files={"image": b"not an image"})
        many = await client.post("/v1/models/tiny-rtdetr/detect?max_detections=0", files={"image": b"x"})
        png = io.BytesIO()
        photo("coffee.png").save(png, format="PNG")
        drawn = await client.post(
            "/v1/models/tiny-rtdetr/detect?render=png&threshold=0", files={"image": png.getvalue()}
        )
    assert response.status_code == 415 and many.status_code == 422
    assert drawn.status_code == 200 and drawn.headers["content-type"] == "image/png"
