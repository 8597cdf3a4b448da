"""Model versions for the model-control tests: copies of a committed version whose output differs.

``publish(...)`` writes a version folder the way docs/model-control.md says to publish one: into
a hidden ``.<version>.partial`` folder first, then renamed to ``<version>``, so a poll never sees
half a version. Version kinds:

* ``"reversed"``: the classifier's logits in reverse class order (a Gather on axis 1), so every
  prediction names another class than version 1 does for the same image and the version that
  answered is visible in the answer itself;
* ``"copy"``: the same graph;
* ``"wrong-input"``: the graph's input renamed (``pixels``), which its manifest does not name;
* ``"bad-manifest"``: a manifest with an unknown field.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest


def _reversed_logits(graph_path: Path, out: Path, classes: int) -> None:
    model = onnx.load(str(graph_path))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["logits_raw" if name == "logits" else name for name in node.output]
    indices = numpy_helper.from_array(np.arange(classes - 1, -1, -1, dtype=np.int64), "reverse_classes")
    graph.initializer.append(indices)
    graph.node.append(helper.make_node("Gather", ["logits_raw", "reverse_classes"], ["logits"], axis=1))
    onnx.save(model, str(out))


def _renamed_input(graph_path: Path, out: Path) -> None:
    model = onnx.load(str(graph_path))
    old = model.graph.input[0].name
    model.graph.input[0].name = "pixels"
    for node in model.graph.node:
        node.input[:] = ["pixels" if name == old else name for name in node.input]
    onnx.save(model, str(out))


def publish(repository: Path, name: str, version: int, kind: str = "reversed", source_version: int = 1) -> Path:
    """Write ``<repository>/<name>/<version>/`` from ``source_version``, atomically (write, then rename)."""
    source = repository / name / str(source_version)
    partial = repository / name / f".{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    shutil.copy(source / "model.json", partial / "model.json")
    manifest = load_manifest(source / "model.json")
    if kind == "reversed":
        _reversed_logits(source / "model.onnx", partial / "model.onnx", len(manifest.labels))
    elif kind == "wrong-input":
        _renamed_input(source / "model.onnx", partial / "model.onnx")
    else:
        shutil.copy(source / "model.onnx", partial / "model.onnx")
    if kind == "bad-manifest":
        data = json.loads((source / "model.json").read_text())
        data["not_a_field"] = 1
        (partial / "model.json").write_text(json.dumps(data))
    final = repository / name / str(version)
    partial.rename(final)
    return final


class Reference:
    """Each version's expected top-5 (class ids, scores) for image files, from ONNX Runtime run here."""

    def __init__(self, repository: Path, name: str) -> None:
        self.repository, self.name = repository, name
        self._cache: dict[tuple[int, str], tuple[list[int], np.ndarray]] = {}

    def expected(self, version: int, image: Path, top_k: int = 5) -> tuple[list[int], np.ndarray]:
        """(class ids, softmax scores float32), best first, as ``version`` classifies ``image``."""
        key = (version, str(image))
        if key not in self._cache:
            folder = self.repository / self.name / str(version)
            manifest = load_manifest(folder / "model.json")
            decoded = decode_image(image.read_bytes(), color_mode=manifest.preprocessing.color_mode, max_pixels=10**8)
            x = Preprocessor(manifest.preprocessing)(decoded.image)[None]  # (1, C, H, W) float32
            session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
            logits = session.run(["logits"], {manifest.input.name: x})[0][0].astype(np.float64)
            scores = np.exp(logits - logits.max())
            scores /= scores.sum()
            order = list(np.argsort(-scores, kind="stable"))
            self._cache[key] = ([int(i) for i in order], scores[order].astype(np.float32))
        ids, scores = self._cache[key]
        return ids[:top_k], scores[:top_k]

    def matches(self, version: int, image: Path, body: dict) -> bool:
        """Whether a classify answer ``body`` is ``version``'s output for ``image`` (scores to 1e-4)."""
        ids, scores = self.expected(version, image, len(body["predictions"]))
        got_ids = [p["class_id"] for p in body["predictions"]]
        got_scores = np.array([p["score"] for p in body["predictions"]])
        return got_ids[:1] == ids[:1] and np.allclose(got_scores, scores, atol=1e-4)
