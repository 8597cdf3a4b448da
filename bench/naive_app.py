"""(e) The naive endpoint: what a user writes first with FastAPI and ONNX Runtime.

    PATCHSERVE_BENCH_MODEL=bench/.work/model_repository/vit-ti16-random/1 uvicorn bench.naive_app:app --port 8001

A plain sync route (FastAPI runs it in its thread pool), ``UploadFile`` for the multipart
upload, one ONNX Runtime call per request with the session's default settings, the response
built with FastAPI's default JSON encoder. Decoding and preprocessing are the server's own
(Pillow with JPEG draft mode, then the manifest's resize and normalisation), so that the
comparison measures the serving machinery, not a different image pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, UploadFile

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.manifest import load_manifest

MODEL_DIR = Path(os.environ.get("PATCHSERVE_BENCH_MODEL", "bench/.work/model_repository/vit-ti16-random/1"))
manifest = load_manifest(MODEL_DIR / "model.json")
preprocess = Preprocessor(manifest.preprocessing)
session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name

app = FastAPI()


@app.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


@app.post("/predict")
def predict(image: UploadFile, top_k: int = 5) -> dict:
    decoded = decode_image(
        image.file.read(),
        color_mode=preprocess.spec.color_mode,
        max_pixels=40_000_000,
        draft_size=preprocess.draft_size,
    )
    x = preprocess(decoded.image)[None]  # (1, C, H, W)
    logits = session.run(None, {input_name: x})[0][0]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    top = np.argsort(-probabilities)[:top_k]
    return {
        "image": {"width": decoded.width, "height": decoded.height},
        "predictions": [
            {"label": manifest.labels[i], "class_id": int(i), "score": float(probabilities[i])} for i in top
        ],
    }
