"""(f) LitServe serving the same ONNX model, with its dynamic batching on.

    python -m bench.litserve_app --model bench/.work/model_repository/vit-ti16-random/1 --port 8002

Written the way LitServe's documentation shows it: ``decode_request`` reads the multipart
upload and decodes and preprocesses it (the server's own decoding and preprocessing, as for
every contestant), ``batch`` stacks, ``predict`` runs ONNX Runtime once per batch (default
session settings), ``unbatch`` splits, ``encode_response`` builds the top-k JSON. One
inference worker on the CPU, one API server process: LitServe's defaults for one device.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import litserve as ls
import numpy as np
import onnxruntime as ort

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest


class ViTAPI(ls.LitAPI):
    def __init__(self, model_dir: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.model_dir = model_dir

    def setup(self, device: str) -> None:
        self.manifest = load_manifest(self.model_dir / "model.json")
        self.preprocess = Preprocessor(self.manifest.preprocessing)
        self.session = ort.InferenceSession(str(self.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def decode_request(self, request):
        upload = request["image"]
        decoded = decode_image(
            upload.file.read(),
            color_mode=self.preprocess.spec.color_mode,
            max_pixels=40_000_000,
            draft_size=self.preprocess.draft_size,
        )
        return self.preprocess(decoded.image), (decoded.width, decoded.height)

    def batch(self, inputs):
        return np.stack([x for x, _ in inputs]), [size for _, size in inputs]  # (B, C, H, W)

    def predict(self, batch):
        x, sizes = batch
        return self.session.run(None, {self.input_name: x})[0], sizes  # (B, num_classes)

    def unbatch(self, output):
        logits, sizes = output
        return list(zip(logits, sizes, strict=True))

    def encode_response(self, output):
        logits, (width, height) = output
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        top = np.argsort(-probabilities)[:5]
        return {
            "image": {"width": width, "height": height},
            "predictions": [
                {"label": self.manifest.labels[i], "class_id": int(i), "score": float(probabilities[i])} for i in top
            ],
        }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.litserve_app", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="<repository>/<name>/<version>")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout", type=float, default=0.005, help="seconds")
    args = parser.parse_args()
    api = ViTAPI(args.model, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1)
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
