"""The real tritonclient[http] client against the real server, on imported transformers models.

The server runs from the torch-free serving environment on a repository holding vit-digits and
random-weight transformers checkpoints imported with ``python -m export hf`` (the session
fixture ``hf_repository``); the client is NVIDIA's own, from PyPI.
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from tritonclient.utils import InferenceServerException

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest
from service.tasks import classification
from service.tasks import detection as detection_task
from tests.conftest import ROOT, server_process

pytestmark = pytest.mark.slow
# The detector's /v1 comparisons need POST /v1/models/{name}/detect (issue 4, DETR).
HAS_DETECT = hasattr(detection_task, "detect")
needs_detect = pytest.mark.skipif(not HAS_DETECT, reason="needs the /v1 detect route and postprocess.detect (issue 4)")
CHELSEA = Path("/work/shared/images/skimage/chelsea.png")
DIGIT_7 = ROOT / "examples" / "digit-7.png"


@pytest.fixture(scope="module")
def server(hf_repository: Path):
    """(base URL, tritonclient InferenceServerClient, repository) for one real server."""
    if not CHELSEA.exists():
        pytest.fail(f"{CHELSEA} missing: the shared test images are part of the machine set-up")
    repository = hf_repository / "repository"
    with server_process(env={"PATCHSERVE_MODEL_REPOSITORY": str(repository)}) as (url, _):
        client = triton.InferenceServerClient(url=url.removeprefix("http://"))
        try:
            yield url, client, repository
        finally:
            client.close()


def served_tensor(repository: Path, model: str, *files: Path) -> np.ndarray:
    """What the server feeds the graph for these image files: its own decoding and preprocessing."""
    manifest = load_manifest(repository / model / "1" / "model.json")
    preprocess = Preprocessor(manifest.preprocessing)
    mode = manifest.preprocessing.color_mode
    return np.stack([preprocess(decode_image(f.read_bytes(), color_mode=mode, max_pixels=10**8).image) for f in files])


def triton_infer(
    client, model: str, x: np.ndarray, outputs: list[str], *, binary: bool, mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    tensor = triton.InferInput("pixel_values", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    tensors = [tensor]
    if mask is not None:  # the detector's optional second input
        tensors.append(triton.InferInput("pixel_mask", list(mask.shape), "INT64"))
        tensors[-1].set_data_from_numpy(mask, binary_data=binary)
    requested = [triton.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    result = client.infer(model, tensors, outputs=requested, request_id="triton-1")
    assert result.get_response()["id"] == "triton-1"
    return {name: result.as_numpy(name) for name in outputs}


def test_health_and_metadata_through_tritonclient(server) -> None:
    _, client, _ = server
    assert client.is_server_live() and client.is_server_ready()
    for model in ("vit-digits", "tiny-vit", "tiny-deit-distilled", "tiny-detr"):
        assert client.is_model_ready(model) and client.is_model_ready(model, "1")
    assert not client.is_model_ready("vit-digits", "2")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "patchserve" and "binary_tensor_data" in metadata["extensions"]
    vit = client.get_model_metadata("tiny-vit")
    assert vit["platform"] == "onnxruntime_onnx" and vit["versions"] == ["1"]
    assert vit["inputs"] == [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert vit["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
        {"name": "embedding", "datatype": "FP32", "shape": [-1, 32]},  # issue 16: every imported classifier embeds
        {"name": "attentions", "datatype": "FP32", "shape": [-1, 2, 1, 17, 17]},  # issue 20: heads fused (render=png)
    ]
    detr = client.get_model_metadata("tiny-detr", "1")
    assert detr["inputs"] == [  # issue 18: the pixel mask, optional (all ones when a request leaves it out)
        {"name": "pixel_values", "datatype": "FP32", "shape": [-1, 3, -1, -1]},
        {"name": "pixel_mask", "datatype": "INT64", "shape": [-1, -1, -1]},
    ]
    assert [(o["name"], o["shape"]) for o in detr["outputs"]] == [
        ("pred_logits", [-1, 12, 5]),
        ("pred_boxes", [-1, 12, 4]),
    ]
    config = client.get_model_config("tiny-detr")
    assert config["max_batch_size"] >= 1 and config["input"][0]["dims"] == [3, -1, -1]
    assert config["input"][1] == {"name": "pixel_mask", "data_type": "TYPE_INT64", "dims": [-1, -1], "optional": True}
    with pytest.raises(InferenceServerException, match="no model named 'nope'") as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "404"


@pytest.mark.parametrize(("model", "image"), [("vit-digits", DIGIT_7), ("tiny-vit", CHELSEA)])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_classifier_infer_equals_v1_classify(server, model: str, image: Path, binary: bool) -> None:
    url, client, repository = server
    x = served_tensor(repository, model, image)  # (1, C, H, W)
    logits = triton_infer(client, model, x, ["logits"], binary=binary)["logits"]
    labels = load_manifest(repository / model / "1" / "model.json").labels
    v1 = httpx.post(f"{url}/v1/models/{model}/classify", files={"image": image.read_bytes()}, params={"top_k": 10})
    assert v1.status_code == 200, v1.text
    ours = classification.classify(logits[0], labels, 10)
    assert [p["label"] for p in ours] == [p["label"] for p in v1.json()["predictions"]]
    np.testing.assert_allclose([p["score"] for p in ours], [p["score"] for p in v1.json()["predictions"]], atol=1e-6)


def test_a_batch_through_tritonclient_equals_its_rows(server) -> None:
    _, client, repository = server
    x = served_tensor(repository, "tiny-deit-distilled", CHELSEA, CHELSEA, DIGIT_7)
    batch = triton_infer(client, "tiny-deit-distilled", x, ["logits"], binary=True)["logits"]
    rows = [
        triton_infer(client, "tiny-deit-distilled", x[i : i + 1], ["logits"], binary=True)["logits"] for i in range(3)
    ]
    assert batch.shape == (3, 10)
    np.testing.assert_allclose(batch, np.concatenate(rows), atol=1e-5)
    np.testing.assert_array_equal(batch[0], batch[1])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_detector_infer_through_tritonclient(server, binary: bool) -> None:
    _, client, repository = server
    x = served_tensor(repository, "tiny-detr", CHELSEA)  # chelsea is 451x300: (1, 3, 96, 144)
    assert x.shape == (1, 3, 96, 144)
    out = triton_infer(client, "tiny-detr", x, ["pred_logits", "pred_boxes"], binary=binary)
    assert out["pred_logits"].shape == (1, 12, 5) and out["pred_boxes"].shape == (1, 12, 4)
    assert np.all((out["pred_boxes"] >= 0) & (out["pred_boxes"] <= 1))
    # The same tensor through ONNX Runtime directly (the graph the server loaded), padded to the
    # bucket /v1 pads the image to, (96, 160), with its mask: a row runs in its bucket.
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(repository / "tiny-detr" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    padded = np.zeros((1, 3, 96, 160), np.float32)
    padded[..., :144] = x
    mask = np.zeros((1, 96, 160), np.int64)
    mask[..., :144] = 1
    logits, boxes = session.run(None, {"pixel_values": padded, "pixel_mask": mask})
    np.testing.assert_allclose(out["pred_logits"], logits, atol=1e-5)
    np.testing.assert_allclose(out["pred_boxes"], boxes, atol=1e-5)


def test_default_outputs_come_back_binary_and_errors_are_client_exceptions(server) -> None:
    _, client, repository = server
    x = served_tensor(repository, "tiny-vit", CHELSEA)
    tensor = triton.InferInput("pixel_values", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("tiny-vit", [tensor])  # no outputs named: the client asks for all, binary
    assert result.as_numpy("logits").shape == (1, 10)
    assert "binary_data_size" in result.get_output("logits")["parameters"]
    top = client.infer("tiny-vit", [tensor], outputs=[triton.InferRequestedOutput("logits", class_count=3)])
    assert top.as_numpy("logits").shape == (1, 3)
    wrong = triton.InferInput("pixel_values", [1, 3, 16, 16], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(InferenceServerException, match=r"\[-1, 3, 32, 32\]") as bad:
        client.infer("tiny-vit", [wrong])
    assert bad.value.status() == "400"


@pytest.mark.parametrize("model", ["tiny-vit", "tiny-deit-distilled"])
def test_classifier_top5_equals_the_transformers_pipeline(server, hf_repository: Path, model: str) -> None:
    from transformers import pipeline

    url, _, _ = server
    classifier = pipeline("image-classification", model=str(hf_repository / "checkpoints" / model), device="cpu")
    expected = classifier(Image.open(io.BytesIO(CHELSEA.read_bytes())).convert("RGB"), top_k=5)
    response = httpx.post(
        f"{url}/v1/models/{model}/classify", files={"image": CHELSEA.read_bytes()}, params={"top_k": 5}
    )
    served = response.json()["predictions"]
    assert [p["label"] for p in served] == [p["label"] for p in expected]
    np.testing.assert_allclose([p["score"] for p in served], [p["score"] for p in expected], atol=1e-5)


def detections_from(out: dict[str, np.ndarray], repository: Path, image: Path, threshold: float) -> list[dict]:
    """Detections from v2's raw outputs, post-processed as /v1/detect does for the same image."""
    manifest = load_manifest(repository / "tiny-detr" / "1" / "model.json")
    preprocessor = Preprocessor(manifest.preprocessing)
    with Image.open(image) as opened:
        size = opened.size  # (width, height); a PNG is decoded at full size
    return detection_task.detect(
        out["pred_logits"][0],
        out["pred_boxes"][0],
        manifest.labels,
        threshold=threshold,
        max_detections=100,
        box_scale=preprocessor.box_scale(size, size),
        image_size=size,
    )


def assert_same_detections(got: list[dict], expected: list[dict], *, box_px: float, score: float) -> None:
    """One-to-one: same count, and each detection matches one of ``expected`` (label, box, score)."""
    assert len(got) == len(expected) > 0
    unmatched = list(expected)
    for detection in got:
        corners = np.array([detection["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")])
        distances = [
            np.max(np.abs(corners - [e["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")])) for e in unmatched
        ]
        best = unmatched.pop(int(np.argmin(distances)))
        assert min(distances) <= box_px, (detection, best)
        assert detection["label"] == best["label"] and abs(detection["score"] - best["score"]) <= score, (
            detection,
            best,
        )


@needs_detect
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("padded_by", ["client", "server"])
def test_detector_infer_equals_v1_detect(server, binary: bool, padded_by: str) -> None:
    url, client, repository = server
    x = served_tensor(repository, "tiny-detr", CHELSEA)  # (1, 3, 96, 144): /v1 pads it to its (96, 160) bucket
    if padded_by == "client":  # as the Hugging Face processor pads, with the mask
        padded = np.zeros((1, 3, 96, 160), np.float32)
        padded[..., :144] = x
        mask = np.zeros((1, 96, 160), np.int64)
        mask[..., :144] = 1
        out = triton_infer(client, "tiny-detr", padded, ["pred_logits", "pred_boxes"], binary=binary, mask=mask)
    else:  # the resized image alone: the server pads it to the same bucket
        out = triton_infer(client, "tiny-detr", x, ["pred_logits", "pred_boxes"], binary=binary)
    v1 = httpx.post(f"{url}/v1/models/tiny-detr/detect", files={"image": CHELSEA.read_bytes()}, params={"threshold": 0})
    assert v1.status_code == 200, v1.text
    served = v1.json()["detections"]
    assert len(served) == 12  # threshold 0: every query
    assert_same_detections(detections_from(out, repository, CHELSEA, 0.0), served, box_px=1e-3, score=1e-6)


@needs_detect
@pytest.mark.parametrize("name", ["chelsea.png", "astronaut.png", "coffee.png"])
def test_v1_detect_equals_detr_image_processor_and_post_processing(server, hf_repository: Path, name: str) -> None:
    import torch
    from transformers import AutoImageProcessor, DetrForObjectDetection

    url, _, _ = server
    path = CHELSEA.parent / name
    folder = hf_repository / "checkpoints" / "tiny-detr"
    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    model = DetrForObjectDetection.from_pretrained(str(folder), local_files_only=True).eval()
    image = Image.open(path).convert("RGB")
    # Issue 18: the server pads the image to its bucket with a pixel mask; the processor pads to the same size.
    spec = load_manifest(hf_repository / "repository" / "tiny-detr" / "1" / "model.json").preprocessing
    _, _, h, w = processor(images=image, return_tensors="pt")["pixel_values"].shape
    bucket_h, bucket_w = spec.bucket_for(h, w)
    inputs = processor(images=image, return_tensors="pt", pad_size={"height": bucket_h, "width": bucket_w})
    assert inputs["pixel_values"].shape[-2:] == (bucket_h, bucket_w) and int(inputs["pixel_mask"].sum()) == h * w
    with torch.no_grad():
        outputs = model(**inputs)
    (result,) = processor.post_process_object_detection(
        outputs, threshold=0.0, target_sizes=[(image.height, image.width)]
    )
    expected = []
    for label, score, box in zip(result["labels"], result["scores"], result["boxes"], strict=True):
        # transformers leaves boxes unclipped; the server clips them to the image (DESIGN.md)
        x0, y0, x1, y1 = np.clip(box.numpy().astype(np.float64), 0, [image.width, image.height] * 2)
        box_dict = {"xmin": x0, "ymin": y0, "xmax": x1, "ymax": y1}
        expected.append({"label": model.config.id2label[int(label)], "score": float(score), "box": box_dict})
    response = httpx.post(
        f"{url}/v1/models/tiny-detr/detect", files={"image": path.read_bytes()}, params={"threshold": 0}
    )
    assert response.status_code == 200, response.text
    assert response.json()["image"] == {"width": image.width, "height": image.height}
    assert_same_detections(response.json()["detections"], expected, box_px=0.5, score=1e-4)
