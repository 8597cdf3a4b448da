"""The backbone families (export/hf_backbones.py): DINOv2 (+registers, SwiGLU), Swin, Swinv2, BEiT.

The parity suite of issue 20: ONNX Runtime against transformers on the same batch of real
photos (batch 1 and 3), and the server's ``classify`` / ``embed`` against transformers' processor
and model; ``render=png`` for each family (drawn, or refused with the reason); refusals by name.
Random-weight checkpoints are built offline from the presets (nothing is downloaded).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from export.hf import ImportRefused, export_hf, preprocessing_from_processor
from export.hf_backbones import BACKBONE_PRESETS
from export.hf_presets import PRESETS
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest
from tests.conftest import MODEL_REPOSITORY, ROOT, make_settings, running_app
from tests.export.hf_helpers import import_presets, transformers_model
from tests.service.helpers import assert_problem

PHOTOS = [ROOT / "tests" / "images" / "skimage" / name for name in ("chelsea.png", "astronaut.png", "coffee.png")]
# preset -> (architecture, prefix tokens of its attention output, or None: a class activation map instead)
FAMILIES = {
    "tiny-vit": ("ViTForImageClassification", ["class"]),
    "tiny-dinov2": ("Dinov2ForImageClassification", ["class"]),
    "tiny-dinov2-swiglu": ("Dinov2ForImageClassification", ["class"]),
    "tiny-dinov2-registers": ("Dinov2WithRegistersForImageClassification", ["class"] + ["register"] * 4),
    "tiny-swin": ("SwinForImageClassification", None),
    "tiny-swinv2": ("Swinv2ForImageClassification", None),
    "tiny-beit": ("BeitForImageClassification", ["class"]),
    "tiny-deit": ("DeiTForImageClassification", ["class", "distillation"]),  # every DeiT has the token
    "tiny-deit-distilled": ("DeiTForImageClassificationWithTeacher", ["class", "distillation"]),
}
TOLERANCE = 1e-4


def photos() -> list[Image.Image]:
    return [Image.open(path).convert("RGB") for path in PHOTOS]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """Every family's tiny preset built offline and imported: ``checkpoints/<preset>``, ``repository/<preset>/1``."""
    return import_presets(tmp_path_factory.mktemp("backbones"), FAMILIES)


def head_input(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """What the transformers head takes, computed from transformers' own base model outputs (B, D)."""
    backbone = getattr(model, model.base_model_prefix)
    with torch.no_grad():
        out = backbone(pixel_values=pixel_values)
    if model.config.model_type in ("dinov2", "dinov2_with_registers"):
        prefix = 1 + getattr(model.config, "num_register_tokens", 0)
        tokens = out.last_hidden_state
        return torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=1)
    if model.config.model_type in ("vit", "deit"):  # the class token
        return out.last_hidden_state[:, 0]
    return out.pooler_output


@pytest.mark.parametrize(
    "preset",
    [
        "dinov2-small-imagenet1k-1-layer",
        "swin-tiny-patch4-window7-224",
        "swinv2-tiny-patch4-window8-256",
        "beit-base-patch16-224",
    ],
)
def test_served_preprocessing_equals_the_transformers_processor(tmp_path: Path, preset: str) -> None:
    from transformers import AutoImageProcessor

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRESETS[preset][1]))
    processor = AutoImageProcessor.from_pretrained(str(tmp_path), local_files_only=True)
    ours = Preprocessor(preprocessing_from_processor(PRESETS[preset][1], "classification"))
    size = 256 if preset.startswith("swinv2") else 224
    for image in photos():
        theirs = processor(images=image, return_tensors="np")["pixel_values"][0]
        mine = ours(image)
        assert mine.shape == theirs.shape == (3, size, size) and mine.dtype == np.float32
        assert float(np.max(np.abs(mine - theirs))) <= 1e-5, preset


def test_the_presets_are_the_published_architectures() -> None:
    giant = BACKBONE_PRESETS["dinov2-giant-imagenet1k-1-layer"][0]
    assert (giant["hidden_size"], giant["num_hidden_layers"], giant["use_swiglu_ffn"]) == (1536, 40, True)
    assert BACKBONE_PRESETS["dinov2-with-registers-small-imagenet1k-1-layer"][0]["num_register_tokens"] == 4
    assert BACKBONE_PRESETS["tiny-dinov2-swiglu"][0]["use_swiglu_ffn"] is True
    assert set(BACKBONE_PRESETS) <= set(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("preset", list(FAMILIES))
def test_onnx_runtime_equals_transformers_at_batch_1_and_3(imported: Path, preset: str) -> None:
    from transformers import AutoImageProcessor

    folder, out = imported / "checkpoints" / preset, imported / "repository" / preset / "1"
    manifest = load_manifest(out / "model.json")
    architecture, prefix = FAMILIES[preset]
    assert architecture in manifest.description and manifest.roles == {"logits": "logits", "embedding": "embedding"}
    assert max(manifest.provenance.export.parity_max_abs_diff.values()) <= TOLERANCE  # measured at export
    model = transformers_model(folder)  # transformers' default attention (SDPA), not the exported eager one
    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    pixel_values = processor(images=photos(), return_tensors="np")["pixel_values"]  # (3, 3, 32, 32)
    for batch in (pixel_values[:1], pixel_values):
        with torch.no_grad():
            logits = model(pixel_values=torch.from_numpy(batch)).logits.numpy()  # (B, 10)
        pooled = head_input(model, torch.from_numpy(batch))  # (B, D)
        got = dict(zip(manifest.outputs, session.run(None, {"pixel_values": batch}), strict=True))
        assert got["logits"].shape == (len(batch), 10) and got["embedding"].shape == tuple(pooled.shape)
        assert float(np.max(np.abs(got["logits"] - logits))) <= TOLERANCE, (preset, len(batch))
        assert float(np.max(np.abs(got["embedding"] - pooled.numpy()))) <= TOLERANCE, (preset, len(batch))
        if architecture != "DeiTForImageClassificationWithTeacher":  # the embedding is what the head takes
            with torch.no_grad():
                np.testing.assert_allclose(model.classifier(pooled).numpy(), logits, atol=1e-5)
    if prefix is None:  # Swin: no attention output; per-token class scores whose mean is the logits
        assert manifest.attention is None and "windows" in (manifest.no_attention_reason or "")
        assert "attentions" not in manifest.outputs and manifest.class_maps is not None
        assert (manifest.class_maps.grid.height, manifest.class_maps.grid.width) == (4, 4)  # 32 px / 4 / 2
        backbone = getattr(model, model.base_model_prefix)
        with torch.no_grad():
            tokens = backbone(pixel_values=torch.from_numpy(pixel_values)).last_hidden_state  # (3, 16, hidden)
            expected = model.classifier(tokens).numpy()  # (3, 16, 10)
        assert got["class_maps"].shape == (3, 16, 10)
        assert float(np.max(np.abs(got["class_maps"] - expected))) <= TOLERANCE
        np.testing.assert_allclose(got["class_maps"].mean(axis=1), got["logits"], atol=1e-5)
    else:
        assert manifest.attention is not None and manifest.attention.prefix_tokens == prefix
        assert got["attentions"].shape == (3, 2, 1, len(prefix) + 16, len(prefix) + 16)  # (B, depth, 1, T, T)
        np.testing.assert_allclose(got["attentions"].sum(axis=-1), 1.0, atol=1e-5)  # softmax rows


def test_dinov2_embeddings_concatenate_the_class_token_and_the_patch_mean_without_registers() -> None:
    from export.hf_backbones import _dinov2_pool

    class Out:  # (B=1, 1 class + 2 registers + 2 patches, hidden 2)
        last_hidden_state = torch.tensor([[[1.0, 2.0], [50.0, 50.0], [60.0, 60.0], [3.0, 5.0], [5.0, 9.0]]])

    assert _dinov2_pool(3)(Out).tolist() == [[1.0, 2.0, 4.0, 7.0]]
    assert _dinov2_pool(1)(Out).tolist() == [[1.0, 2.0, 29.5, 31.0]]


@pytest.mark.slow
@pytest.mark.anyio
async def test_served_classify_and_embed_equal_transformers_on_real_photos(imported: Path) -> None:
    from transformers import AutoImageProcessor

    repository = imported / "repository"
    async with running_app(make_settings(model_repository=repository)) as client:
        for preset in FAMILIES:
            folder = imported / "checkpoints" / preset
            model, processor = transformers_model(folder), AutoImageProcessor.from_pretrained(str(folder))
            for path, image in zip(PHOTOS, photos(), strict=True):
                pixel_values = torch.from_numpy(processor(images=image, return_tensors="np")["pixel_values"])
                with torch.no_grad():
                    scores = torch.softmax(model(pixel_values=pixel_values).logits, dim=-1)[0].numpy()  # (10,)
                pooled = head_input(model, pixel_values)[0].numpy()  # (D,)
                upload = {"image": path.read_bytes()}
                classified = await client.post(f"/v1/models/{preset}/classify?top_k=10", files=upload)
                embedded = await client.post(f"/v1/models/{preset}/embed?normalize=false", files=upload)
                assert classified.status_code == 200 and embedded.status_code == 200, (classified.text, embedded.text)
                served = {p["class_id"]: p["score"] for p in classified.json()["predictions"]}
                assert sorted(served) == list(range(10))
                assert max(abs(served[i] - float(scores[i])) for i in range(10)) <= TOLERANCE, (preset, path.name)
                vector = np.array(embedded.json()["embedding"])
                assert embedded.json()["dimensions"] == pooled.shape[0]
                assert float(np.max(np.abs(vector - pooled))) <= TOLERANCE, (preset, path.name)


@pytest.mark.slow
@pytest.mark.anyio
async def test_render_png_draws_the_rollout_or_for_swin_the_class_activation_map(imported: Path) -> None:
    cat = PHOTOS[0].read_bytes()  # 451x300
    async with running_app(make_settings(model_repository=imported / "repository")) as client:
        for preset in FAMILIES:
            response = await client.post(f"/v1/models/{preset}/classify?render=png", files={"image": cat})
            assert response.status_code == 200 and response.headers["content-type"] == "image/png", preset
            picture = Image.open(io.BytesIO(response.content))
            assert picture.format == "PNG" and picture.size == (451, 300)
            pixels = np.asarray(picture.convert("RGB")).astype(int)
            original = np.asarray(Image.open(io.BytesIO(cat)).convert("RGB")).astype(int)
            assert np.abs(pixels - original).mean() > 10, preset  # the heat map is drawn over the photo


@pytest.mark.slow
@pytest.mark.anyio
async def test_render_png_without_attention_or_class_maps_is_refused_with_the_reason(imported: Path) -> None:
    repository = imported / "refusing"
    copy = repository / "tiny-swin" / "1"
    copy.mkdir(parents=True)
    manifest = json.loads((imported / "repository" / "tiny-swin" / "1" / "model.json").read_text())
    (copy / "model.json").write_text(json.dumps({**manifest, "class_maps": None}))
    shutil.copy(imported / "repository" / "tiny-swin" / "1" / "model.onnx", copy / "model.onnx")
    upload = {"image": PHOTOS[0].read_bytes()}
    async with running_app(make_settings(model_repository=repository)) as client:
        response = await client.post("/v1/models/tiny-swin/classify?render=png", files=upload)
        plain = await client.post("/v1/models/tiny-swin/classify", files=upload)
    assert_problem(response, 422, "shifted local windows")
    assert plain.status_code == 200 and len(plain.json()["predictions"]) == 5


def refuse(tmp_path: Path, architecture: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PRESETS["tiny-dinov2"][1]))
    with pytest.raises(ImportRefused) as refused:
        export_hf(tmp_path, tmp_path / "out", opset=18)
    assert not (tmp_path / "out").exists()
    return str(refused.value)


def test_dinov3_and_bare_backbones_are_refused_by_name(tmp_path: Path) -> None:
    dinov3 = refuse(tmp_path, "DINOv3ViTModel")
    assert "DINOv3ViTModel" in dinov3 and "without a classification head" in dinov3
    bare = refuse(tmp_path, "SwinModel")
    assert "SwinModel" in bare and "without a classification head" in bare and "ForImageClassification" in bare
    unknown = refuse(tmp_path, "ConvNextForImageClassification")
    assert "ConvNextForImageClassification" in unknown
    for supported in ("Dinov2WithRegistersForImageClassification", "Swinv2ForImageClassification", "BeitFor"):
        assert supported in unknown


def test_a_committed_manifest_without_prefix_tokens_means_one_class_token() -> None:
    manifest = load_manifest(MODEL_REPOSITORY / "vit-cifar10" / "1" / "model.json")
    assert (
        "prefix_tokens"
        not in json.loads((MODEL_REPOSITORY / "vit-cifar10" / "1" / "model.json").read_text())["attention"]
    )
    assert manifest.attention is not None and manifest.attention.prefix_tokens == ["class"]
