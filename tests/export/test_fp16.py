"""``python -m export fp16``: float16 weights, float32 interface, LayerNorm and Softmax in float32, agreement."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from export import fp16
from export.__main__ import main
from service.runtime.manifest import load_manifest
from service.runtime.sessions import OrtRunner
from tests.conftest import MODEL_REPOSITORY, png_bytes

COMMITTED = MODEL_REPOSITORY / "vit-digits" / "1"


@pytest.fixture(scope="module")
def half(tmp_path_factory) -> object:
    out = tmp_path_factory.mktemp("fp16") / "vit-digits" / "1"
    main(["fp16", str(COMMITTED), "--to", str(out), "--digits-test"])
    return out


def test_weights_become_float16_while_the_interface_and_the_kept_ops_stay_float32(half) -> None:
    graph = onnx.load(str(half / "model.onnx")).graph
    types = {t.name: t.data_type for t in graph.initializer}
    assert types["head.weight"] == onnx.TensorProto.FLOAT16
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    to_float = onnx.TensorProto.FLOAT
    casts_to_float = {n.output[0] for n in graph.node if n.op_type == "Cast" and n.attribute[0].i == to_float}
    layer_norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    assert layer_norms and all(n.input[1] in casts_to_float for n in layer_norms)  # its scale cast back to float32


def test_the_agreement_is_measured_and_written_into_the_manifest(half) -> None:
    manifest = load_manifest(half / "model.json")
    metrics = manifest.provenance.metrics
    assert metrics["agreement_images"] == 360.0
    assert metrics["top1_agreement_fp32"] >= 0.99  # measured: 1.0 on the digits test split
    assert metrics["test_accuracy"] == load_manifest(COMMITTED / "model.json").provenance.metrics["test_accuracy"]
    assert "float16 copy" in manifest.provenance.notes and "(float16 weights)" in manifest.description


def test_the_server_runs_the_float16_copy_unchanged(half, digits_test_split) -> None:
    x = fp16.preprocess_all(half, [png_bytes(p) for p in digits_test_split.images[:32]])  # (32, 1, 8, 8)
    got = OrtRunner(half / "model.onnx", device="cpu").run(x)["logits"]
    expected = OrtRunner(COMMITTED / "model.onnx", device="cpu").run(x)["logits"]
    assert got.dtype == np.float32 and got.shape == (32, 10)
    assert (got.argmax(1) == expected.argmax(1)).all()
    assert np.abs(got - expected).max() < 0.05  # float16 rounding, no more


def test_the_float16_copy_runs_through_an_io_binding_on_the_cpu_provider(half, digits_test_split) -> None:
    x = fp16.preprocess_all(half, [png_bytes(p) for p in digits_test_split.images[:9]])  # (9, 1, 8, 8)
    bound = OrtRunner(half / "model.onnx", device="cpu", io_binding=True)
    got = bound.run(x)["logits"]
    assert bound.device_type == "cpu" and got.dtype == np.float32 and got.shape == (9, 10)
    np.testing.assert_array_equal(got, OrtRunner(half / "model.onnx", device="cpu").run(x)["logits"])


def _first_pixels_as_logits(path, start: int) -> None:
    """A graph (B, 1, 8, 8) -> logits (B, 10): pixels start .. start + 9 of each flattened image."""
    import onnx
    from onnx import TensorProto, helper

    bounds = (("s", start), ("e", start + 10), ("a", 1))
    consts = [helper.make_tensor(name, TensorProto.INT64, [1], [value]) for name, value in bounds]
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"]), helper.make_node("Slice", ["flat", "s", "e", "a"], ["logits"])],
        "pixels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 10])],
        initializer=consts,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def test_agreement_counts_matching_top1_classes(tmp_path) -> None:
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    _first_pixels_as_logits(first, 0)
    _first_pixels_as_logits(second, 10)
    x = np.zeros((5, 1, 8, 8), np.float32)
    flat = x.reshape(5, 64)
    for row, (a, b) in enumerate([(3, 3), (7, 7), (1, 2), (0, 9), (4, 4)]):  # rows 0, 1, 4 agree
        flat[row, a], flat[row, 10 + b] = 1.0, 1.0
    assert fp16.top1_agreement(first, second, x, batch_size=2) == 3 / 5
    assert fp16.top1_agreement(first, first, x) == 1.0


def test_image_files_reads_folders_and_archives_up_to_a_limit(tmp_path) -> None:
    import zipfile

    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(png_bytes(np.full((4, 4), i, np.uint8)))
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as archive:
        archive.writestr("train/a/0.png", png_bytes(np.zeros((4, 4), np.uint8)))
        archive.writestr("test/a/0.png", png_bytes(np.ones((4, 4), np.uint8)))
    assert len(fp16.image_files([tmp_path], limit=2)) == 2
    (only_test,) = fp16.image_files([tmp_path / "data.zip"])
    assert only_test == png_bytes(np.ones((4, 4), np.uint8))
