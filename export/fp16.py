"""An fp16 copy of an exported model, and how often it agrees with the fp32 original (top-1, on CPU).

    python -m export fp16 model_repository/vit-digits/1 --to runs/vit-digits-fp16/1 --digits-test
    python -m export fp16 bench/.work/model_repository/vit-ti16-random/1 --to runs/vit-ti16-fp16/1 \\
        --images ../shared/data/cifar10-jpeg.zip --limit 1000

Weights and activations become float16 (``onnxconverter_common.float16``, ONNX's converter);
the graph's input and outputs stay float32 (``keep_io_types``) so the server, its manifest
and its clients do not change. LayerNormalization and Softmax are kept in float32: their
reductions (a variance, a sum of exponentials) are where float16's 10-bit mantissa loses
the most, and ONNX Runtime's CUDA kernels for them accumulate in float32 anyway.

The agreement is measured here on the CPU provider, on images run through the server's own
decoding and preprocessing, and written into the copy's manifest
(``provenance.metrics.top1_agreement_fp32``). fp16 pays off on a GPU's tensor cores; on a CPU
without native fp16 arithmetic it is slower, so serve it on GPU hosts only.
"""

from __future__ import annotations

import logging
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.imaging.preprocess import Preprocessor
from service.pipeline.decoding import decode_and_preprocess
from service.runtime.manifest import load_manifest, write_manifest

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

KEEP_FP32 = ("LayerNormalization", "Softmax")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


def _own_output_tensors(model: onnx.ModelProto) -> None:
    """Give every graph output that a node also reads (a ViT's ``embedding``, the head's input) its own tensor.

    The converter casts such an output back to float32 under the output's name, and the nodes that
    read it would then get the float32 tensor beside float16 weights (an invalid Gemm). The tensor
    is renamed inside the graph and an Identity copies it to the output, so the cast feeds nothing
    else. Edits ``model`` (an ``onnx.ModelProto``) in place.
    """
    from onnx import helper

    graph = model.graph
    read = {name for node in graph.node for name in node.input}
    for output in graph.output:
        if output.name not in read:
            continue
        inner = f"{output.name}__inner"
        for node in graph.node:
            node.input[:] = [inner if n == output.name else n for n in node.input]
            node.output[:] = [inner if n == output.name else n for n in node.output]
        for info in graph.value_info:
            if info.name == output.name:
                info.name = inner
        graph.node.append(helper.make_node("Identity", [inner], [output.name], name=f"{output.name}__copy"))


def convert(src: Path, dst: Path, *, keep_fp32: Sequence[str] = KEEP_FP32) -> None:
    """Write ``dst/model.onnx``: ``src/model.onnx`` in float16, float32 inputs and outputs.

    Args:
        src: a model version folder (``model.onnx`` + ``model.json``).
        dst: the folder to write ``model.onnx`` into (created).
        keep_fp32: op types left in float32.

    Raises:
        onnx.checker.ValidationError: the converted graph is not valid ONNX.
    """
    import onnx
    from onnxconverter_common.float16 import convert_float_to_float16

    model = onnx.load(str(src / "model.onnx"))
    _own_output_tensors(model)
    with warnings.catch_warnings():  # it warns for every weight below float16's smallest normal number
        warnings.simplefilter("ignore", UserWarning)
        half = convert_float_to_float16(model, keep_io_types=True, op_block_list=list(keep_fp32))
    dst.mkdir(parents=True, exist_ok=True)
    onnx.save(half, str(dst / "model.onnx"))
    onnx.checker.check_model(str(dst / "model.onnx"), full_check=True)
    log.info("wrote %s (%.1f MB)", dst / "model.onnx", (dst / "model.onnx").stat().st_size / 1e6)


def image_files(sources: Iterable[Path], limit: int | None = None) -> list[bytes]:
    """The bytes of every image among ``sources`` (files, folders, or .zip archives), sorted, up to ``limit``."""
    found: list[bytes] = []
    for source in sources:
        if source.suffix == ".zip":
            with zipfile.ZipFile(source) as archive:
                names = sorted(n for n in archive.namelist() if n.lower().endswith(IMAGE_SUFFIXES))
                test_split = [n for n in names if n.startswith("test/")]  # a dataset archive: its test split only
                found += [archive.read(n) for n in (test_split or names)[: limit - len(found) if limit else None]]
        elif source.is_dir():
            found += [p.read_bytes() for p in sorted(source.rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES]
        else:
            found.append(source.read_bytes())
        if limit and len(found) >= limit:
            break
    return found[:limit] if limit else found


def preprocess_all(model_dir: Path, payloads: Sequence[bytes]) -> np.ndarray:
    """Decode and preprocess every payload as the server does: float32 (N, C, H, W)."""
    preprocessor = Preprocessor(load_manifest(model_dir / "model.json").preprocessing)
    return np.stack([decode_and_preprocess(preprocessor, data, max_pixels=40_000_000)[1] for data in payloads])


def top1_agreement(fp32: Path, fp16: Path, inputs: np.ndarray, *, batch_size: int = 32) -> float:
    """The fraction of ``inputs`` (N, C, H, W) on which both graphs' highest logit is the same class (CPU)."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, fp16)]
    name = sessions[0].get_inputs()[0].name
    same = 0
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        top = [session.run(None, {name: batch})[0].argmax(axis=1) for session in sessions]  # (B,) each
        same += int((top[0] == top[1]).sum())
    return same / len(inputs)


def export_fp16(src: Path, dst: Path, inputs: np.ndarray, *, data: str) -> float:
    """Convert ``src`` into ``dst`` (graph + manifest) and measure the top-1 agreement on ``inputs``.

    Returns:
        The agreement, also written to ``dst/model.json`` (``provenance.metrics``).
    """
    convert(src, dst)
    agreement = top1_agreement(src / "model.onnx", dst / "model.onnx", inputs)
    manifest = load_manifest(src / "model.json")
    provenance = manifest.provenance.model_copy(
        update={
            "metrics": {
                **manifest.provenance.metrics,
                "top1_agreement_fp32": agreement,
                "agreement_images": float(len(inputs)),
            },
            "notes": (
                f"{manifest.provenance.notes} float16 copy of {src} (onnxconverter_common, {', '.join(KEEP_FP32)} "
                f"kept in float32); top-1 agreement with float32 measured on the CPU on {len(inputs)} images: "
                f"{data}. The test metrics above are the float32 model's."
            ).strip(),
        }
    )
    write_manifest(
        manifest.model_copy(
            update={"description": f"{manifest.description} (float16 weights)", "provenance": provenance}
        ),
        dst / "model.json",
    )
    log.info("top-1 agreement fp16 vs fp32 on %d images: %.4f", len(inputs), agreement)
    return agreement


def digits_test_inputs(model_dir: Path) -> np.ndarray:
    """The digits test split (360 images) through the model's preprocessing: float32 (360, 1, H, W)."""
    from export import evaluate
    from models.datasets import load_digits_splits

    preprocessor = Preprocessor(load_manifest(model_dir / "model.json").preprocessing)
    return np.stack([preprocessor(evaluate.pil_image(p)) for p in load_digits_splits()[1].images])
