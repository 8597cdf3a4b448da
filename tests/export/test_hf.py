"""Importing transformers checkpoints: processor configs -> manifest, timm refusal, parity with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from export.hf import (
    ImportRefused,
    default_buckets,
    export_hf,
    labels_from_config,
    pad_to_bucket,
    preprocessing_from_processor,
)
from export.hf_presets import PRESETS, build
from service.imaging.preprocess import Preprocessor
from service.imaging.resize import keep_aspect_size
from service.imaging.spec import Preprocessing
from service.runtime.manifest import Size, load_manifest
from tests.conftest import HF_PRESETS

IMAGES = Path("/work/shared/images/skimage")
PHOTOS = ["chelsea.png", "astronaut.png", "coffee.png"]


def photo(name: str = "chelsea.png") -> Image.Image:
    path = IMAGES / name
    if not path.exists():
        pytest.fail(f"{path} missing: the shared test images are part of the machine set-up")
    return Image.open(path).convert("RGB")


def write_processor(folder: Path, preset: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(PRESETS[preset][1]))
    return folder


def test_vit_processor_is_a_stretch_to_its_size() -> None:
    spec = preprocessing_from_processor(PRESETS["vit-base-patch16-224"][1], "classification")
    assert spec.resize == "stretch" and spec.size == Size(height=224, width=224) and spec.crop_size is None
    assert spec.interpolation == "bilinear" and spec.scale == pytest.approx(1 / 255)
    assert spec.mean == [0.5] * 3 and spec.std == [0.5] * 3 and spec.color_mode == "RGB"


def test_deit_legacy_int_size_is_a_square_then_a_centre_crop() -> None:
    spec = preprocessing_from_processor(PRESETS["deit-base-distilled-patch16-224"][1], "classification")
    assert spec.resize == "stretch" and spec.size == Size(height=256, width=256)
    assert spec.crop_size == Size(height=224, width=224) and spec.interpolation == "bicubic"
    assert spec.mean == [0.485, 0.456, 0.406] and spec.std == [0.229, 0.224, 0.225]
    assert Preprocessor(spec).output_shape == (3, 224, 224)


def test_detr_sizes_new_and_legacy_forms() -> None:
    spec = preprocessing_from_processor(PRESETS["detr-resnet-50"][1], "detection")
    legacy = {**PRESETS["detr-resnet-50"][1], "size": 800, "max_size": 1333}
    assert spec == preprocessing_from_processor(legacy, "detection")
    assert spec.resize == "shortest_edge" and (spec.shortest_edge, spec.longest_edge) == (800, 1333)
    assert spec.size is None and Preprocessor(spec).dynamic
    plain = preprocessing_from_processor({"do_rescale": False, "do_normalize": False}, "detection")
    assert plain.scale == 1.0 and plain.mean == [0.0] * 3 and plain.std == [1.0] * 3 and plain.shortest_edge == 800


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        ({"do_resize": False}, "do_resize"),
        ({"pad_size": {"height": 800, "width": 800}}, "pad_size"),
        ({"size": {"max_height": 800, "max_width": 800}}, "no matching resize policy"),
        ({"size": "big"}, "size"),
        ({"resample": 7}, "resample"),
        ({"image_mean": [0.5, 0.5]}, "image_mean"),
        ({"do_center_crop": True, "crop_size": 224}, "crop"),
    ],
)
def test_processors_without_a_matching_policy_are_refused(processor: dict, message: str) -> None:
    with pytest.raises(ImportRefused, match=message):
        preprocessing_from_processor(processor, "detection")


def test_labels_from_id2label_with_no_object_last_for_detection() -> None:
    config = {"id2label": {"1": "dog", "0": "cat"}}
    assert labels_from_config(config, "classification") == ["cat", "dog"]
    assert labels_from_config(config, "detection") == ["cat", "dog", "no-object"]
    assert labels_from_config({"num_labels": 2}, "classification") == ["LABEL_0", "LABEL_1"]


def test_keep_aspect_size_is_the_detr_processors_arithmetic() -> None:
    from transformers.image_transforms import get_resize_output_image_size, get_size_with_aspect_ratio

    rng = np.random.default_rng(0)
    sizes = [(480, 640), (640, 480), (800, 1200), (800, 800), (1, 1000), (1000, 1), (333, 1333), (799, 1333)]
    sizes += [tuple(int(v) for v in rng.integers(1, 3000, size=2)) for _ in range(2000)]
    for height, width in sizes:
        for shortest, longest in [(800, 1333), (96, 160), (224, 224)]:
            assert keep_aspect_size(height, width, shortest, longest) == get_size_with_aspect_ratio(
                (height, width), shortest, longest
            ), (height, width, shortest, longest)
        image = np.zeros((height, width, 3), np.uint8)
        assert keep_aspect_size(height, width, 256, None) == get_resize_output_image_size(
            image, 256, default_to_square=False, input_data_format="channels_last"
        )


@pytest.mark.parametrize("preset", ["vit-base-patch16-224", "deit-base-distilled-patch16-224", "detr-resnet-50"])
def test_served_preprocessing_equals_the_transformers_processor(tmp_path: Path, preset: str) -> None:
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(write_processor(tmp_path, preset)), local_files_only=True)
    task = "detection" if preset.startswith("detr") else "classification"
    ours = Preprocessor(preprocessing_from_processor(PRESETS[preset][1], task))
    for name in PHOTOS:
        image = photo(name)
        theirs = processor(images=image, return_tensors="np")["pixel_values"][0]
        mine = ours(image)
        assert mine.shape == theirs.shape and mine.dtype == np.float32
        assert float(np.max(np.abs(mine - theirs))) <= 1e-5, (preset, name)


def test_a_timm_backbone_detr_is_refused_naming_the_reason(tmp_path: Path) -> None:
    config = {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "use_timm_backbone": True,
        "backbone": "resnet50",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_processor(tmp_path, "detr-resnet-50")
    with pytest.raises(ImportRefused, match=r"timm backbone.*torchvision.*no_timm") as refused:
        export_hf(tmp_path, tmp_path / "out", opset=18)
    assert "'resnet50'" in str(refused.value) and not (tmp_path / "out").exists()
    del config["use_timm_backbone"]  # transformers' default when no backbone_config is given
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportRefused, match="timm"):
        export_hf(tmp_path, tmp_path / "out", opset=18)

    from export.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["hf", str(tmp_path), "--to", str(tmp_path / "out")])
    assert exited.value.code == 2


def test_unsupported_architectures_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportRefused, match=r"config\.json is missing"):
        export_hf(tmp_path, tmp_path / "out", opset=18)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    write_processor(tmp_path, "vit-base-patch16-224")
    with pytest.raises(ImportRefused, match=r"BertForMaskedLM.*ViTForImageClassification"):
        export_hf(tmp_path, tmp_path / "out", opset=18)


def transformers_outputs(folder: Path, pixel_values: np.ndarray) -> dict[str, np.ndarray]:
    import transformers

    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(str(folder), local_files_only=True)
    with torch.no_grad():
        out = model.eval()(pixel_values=torch.from_numpy(pixel_values))
    return {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-vit", "tiny-deit", "tiny-deit-distilled", "tiny-detr"])
def test_imported_graph_equals_transformers_on_a_photo(tmp_path: Path, preset: str, hf_repository: Path) -> None:
    from transformers import AutoImageProcessor

    if preset in HF_PRESETS:  # already imported once for the session
        folder, out = hf_repository / "checkpoints" / preset, hf_repository / "repository" / preset / "1"
        manifest = load_manifest(out / "model.json")
    else:
        folder, out = build(preset, tmp_path / "checkpoint"), tmp_path / "out"
        manifest = export_hf(folder, out, opset=18)
        assert load_manifest(out / "model.json") == manifest
    diffs = manifest.provenance.export.parity_max_abs_diff
    assert set(diffs) == {"1", "3" if preset == "tiny-detr" else "4"} and max(diffs.values()) <= 1e-4

    # Independently of the export's own check: transformers' processor and model on two photos.
    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    images = [photo("chelsea.png"), photo("chelsea.png").transpose(Image.Transpose.ROTATE_90)]
    for image in images:
        pixel_values = processor(images=image, return_tensors="np")["pixel_values"]  # (1, 3, H, W)
        expected = transformers_outputs(folder, pixel_values)
        feed = {"pixel_values": pixel_values}
        if manifest.pixel_mask:  # one unpadded image: an all-ones mask, transformers' default
            feed[manifest.pixel_mask] = np.ones((1, *pixel_values.shape[2:]), np.int64)
        got = dict(zip(manifest.outputs, session.run(None, feed), strict=True))
        if preset == "tiny-detr":
            assert manifest.input.shape == ["batch", 3, "height", "width"]
            assert manifest.labels == ["cat", "dog", "cup", "N/A", "no-object"]
            assert float(np.max(np.abs(got["pred_logits"] - expected["logits"]))) <= 1e-4
            assert float(np.max(np.abs(got["pred_boxes"] - expected["pred_boxes"]))) <= 1e-4
        else:
            assert manifest.input.shape == ["batch", 3, 32, 32] and manifest.labels[7] == "seven"
            assert float(np.max(np.abs(got["logits"] - expected["logits"]))) <= 1e-4
    if preset == "tiny-deit-distilled":  # DeiT's inference rule: the mean of the two heads
        np.testing.assert_allclose(
            expected["logits"], (expected["cls_logits"] + expected["distillation_logits"]) / 2, atol=1e-6
        )
        assert "distillation head" in manifest.provenance.notes


def test_default_buckets_hold_every_resized_photo_with_at_most_a_quarter_padding_to_4_3() -> None:
    buckets = default_buckets(800, 1333)
    assert [(b.height, b.width) for b in buckets] == [(800, 800), (800, 1066), (1066, 800), (800, 1333), (1333, 800)]
    spec = preprocessing_from_processor(PRESETS["detr-resnet-50"][1], "detection")
    bucketed = Preprocessing.model_validate({**spec.model_dump(), "buckets": [b.model_dump() for b in buckets]})
    for width, height in [(640, 480), (480, 640), (4000, 3000), (1000, 1000), (1920, 1080), (3000, 1000), (333, 1000)]:
        h, w = keep_aspect_size(height, width, spec.shortest_edge, spec.longest_edge)
        bucket = bucketed.bucket_for(h, w)
        assert bucket is not None and bucket[0] >= h and bucket[1] >= w
        if max(w, h) / min(w, h) <= 4 / 3:
            assert h * w >= 0.75 * bucket[0] * bucket[1]
    with pytest.raises(ValueError, match="none holds a resized 1333x800"):
        Preprocessing.model_validate({**spec.model_dump(), "buckets": [{"height": 800, "width": 1333}]})


@pytest.mark.slow
def test_imported_detr_with_a_pixel_mask_equals_transformers_on_a_padded_mixed_batch(hf_repository: Path) -> None:
    """The graph's (pixel_values, pixel_mask) equal DetrForObjectDetection's on a bucket-padded batch
    of three photos of other sizes, and each photo's outputs do not depend on its batch mates."""
    import transformers

    folder, out = hf_repository / "checkpoints" / "tiny-detr", hf_repository / "repository" / "tiny-detr" / "1"
    manifest = load_manifest(out / "model.json")
    assert manifest.pixel_mask == "pixel_mask" and manifest.preprocessing.buckets
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixel_values", "pixel_mask"]
    preprocess = Preprocessor(manifest.preprocessing)
    # Three sizes that share a landscape bucket (as the batcher groups them): 3:2, square, 4:3.
    photos = [photo("chelsea.png"), photo("astronaut.png"), photo("coffee.png").crop((0, 0, 532, 400))]
    images = [preprocess(image) for image in photos]  # (3, h, w) each
    assert len({image.shape for image in images}) == 3
    bucket = manifest.preprocessing.bucket_for(max(i.shape[1] for i in images), max(i.shape[2] for i in images))
    assert bucket is not None
    pixel_values, pixel_mask = pad_to_bucket(images, bucket)
    model = transformers.DetrForObjectDetection.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.no_grad():
        expected = model(pixel_values=pixel_values, pixel_mask=pixel_mask)
    logits, boxes = session.run(None, {"pixel_values": pixel_values.numpy(), "pixel_mask": pixel_mask.numpy()})
    assert float(np.max(np.abs(logits - expected.logits.numpy()))) <= 1e-4
    assert float(np.max(np.abs(boxes - expected.pred_boxes.numpy()))) <= 1e-4
    for i, image in enumerate(images):  # alone, padded to the same bucket: the same outputs
        alone_values, alone_mask = pad_to_bucket([image], bucket)
        alone = session.run(None, {"pixel_values": alone_values.numpy(), "pixel_mask": alone_mask.numpy()})
        assert float(np.max(np.abs(alone[0][0] - logits[i]))) <= 1e-4
        assert float(np.max(np.abs(alone[1][0] - boxes[i]))) <= 1e-4


def test_box_scale_maps_normalised_boxes_to_displayed_pixels() -> None:
    spec = preprocessing_from_processor(PRESETS["detr-resnet-50"][1], "detection")
    preprocess = Preprocessor(spec)
    assert preprocess.content_size(640, 480) == (1066, 800)  # (W, H): DETR's 800 / 1333 rule
    # a JPEG draft-decoded at half size still maps [0, 1] onto the displayed 4000 x 3000 pixels
    assert preprocess.box_scale((2000, 1500), (4000, 3000)) == (4000.0, 3000.0)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-vit", "tiny-deit-distilled"])
def test_an_imported_classifier_exports_the_class_token_after_the_final_layernorm(
    preset: str, hf_repository: Path
) -> None:
    import transformers

    folder, out = hf_repository / "checkpoints" / preset, hf_repository / "repository" / preset / "1"
    manifest = load_manifest(out / "model.json")
    assert manifest.outputs == ["logits", "embedding", "attentions"]
    assert manifest.roles == {"logits": "logits", "embedding": "embedding"}
    prefix = ["class", "distillation"] if preset.startswith("tiny-deit") else ["class"]
    assert manifest.attention is not None and manifest.attention.prefix_tokens == prefix
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(str(folder), local_files_only=True).eval()
    backbone = getattr(model, model.base_model_prefix)  # ViTModel / DeiTModel: its output is after the LayerNorm
    pixel_values = np.random.default_rng(0).normal(size=(3, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = backbone(pixel_values=torch.from_numpy(pixel_values)).last_hidden_state[:, 0].numpy()  # (3, hidden)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = dict(zip(manifest.outputs, session.run(None, {"pixel_values": pixel_values}), strict=True))
    assert got["embedding"].shape == (3, 32)
    assert float(np.max(np.abs(got["embedding"] - expected))) <= 1e-4
