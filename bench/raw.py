"""The in-process baselines: (a) ONNX Runtime alone on pre-decoded tensors, (b) decode + preprocess + ORT.

Both use the server's own decoding (``service.imaging.images.decode_image``, JPEG draft mode) and
preprocessing (``service.imaging.preprocess.Preprocessor``) so that every figure in a run measures the
same work, and an ONNX Runtime session with its default settings (what a user gets: every
physical core, spinning threads), on the CPU unless ``device`` says otherwise.

    python -m bench.raw bench/.work/model_repository/vit-ti16-random/1 bench/.work/images/640x480/*.jpg
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from service.imaging.images import decode_image
from service.imaging.preprocess import Preprocessor
from service.runtime.cpus import usable_cpus
from service.runtime.manifest import load_manifest
from service.runtime.sessions import CudaOptions, OrtRunner
from service.runtime.tuning.measure import measure_point

BATCH_SIZES = (1, 2, 4, 8, 16)


def _runner(
    model_dir: Path,
    device: str = "cpu",
    io_binding: bool = False,
    cudnn_conv_algo_search: str = "EXHAUSTIVE",
    intra_op_threads: int = 0,
) -> OrtRunner:
    cuda = CudaOptions(cudnn_conv_algo_search=cudnn_conv_algo_search)
    runner = OrtRunner(
        model_dir / "model.onnx",
        device=device,
        io_binding=io_binding,
        cuda=cuda,
        intra_op_threads=intra_op_threads,  # 0: ORT's default, a thread per physical core
    )
    if not runner.providers.ok:
        raise RuntimeError(runner.providers.reason)
    return runner


def _timed(step: Callable[[], int], seconds: float) -> tuple[int, float]:
    """Call ``step`` (returns images done) until ``seconds`` have passed; return (images, elapsed)."""
    step()  # warm-up, not counted
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        done += step()
    return done, elapsed


def preprocessor_for(model_dir: Path) -> Preprocessor:
    """The model's preprocessing, from its manifest."""
    return Preprocessor(load_manifest(model_dir / "model.json").preprocessing)


def decode(preprocessor: Preprocessor, data: bytes) -> np.ndarray:
    """One file -> the model input (C, H, W) float32, exactly as the server does it (draft mode on)."""
    image = decode_image(
        data, color_mode=preprocessor.spec.color_mode, max_pixels=40_000_000, draft_size=preprocessor.draft_size
    )
    return preprocessor(image.image)


def ort_best_batch(
    model_dir: Path,
    files: Sequence[Path],
    *,
    seconds: float,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    device: str = "cpu",
    io_binding: bool = False,
    cudnn_conv_algo_search: str = "EXHAUSTIVE",
    sessions: int = 1,
) -> dict:
    """(a) ONNX Runtime on pre-decoded tensors, at each batch size; the best is the ceiling.

    ``sessions`` 1: one session with ORT's default threads (a thread per physical core), one
    run at a time. N > 1: N sessions of one intra-op thread each, each running the batch over
    and over in a thread of its own, side by side (the auto-tuner's
    :func:`service.runtime.tuning.measure.measure_point`); on a small CPU that can compute more
    than one wide session, whose threads wait for each other at every operator.
    ``cudnn_conv_algo_search``: the CUDA provider's (``service.runtime.sessions.CudaOptions``); no
    effect on the CPU.

    Returns:
        ``{"images_per_s": best, "best_batch_size": B, "by_batch_size": {B: images/s}, "provider": ...,
        "sessions": N, "intra_op_threads": T}`` (T 0: ORT's default).
    """
    threads = 0 if sessions == 1 else 1
    runners = [_runner(model_dir, device, io_binding, cudnn_conv_algo_search, threads) for _ in range(sessions)]
    preprocessor = preprocessor_for(model_dir)
    tensors = [decode(preprocessor, f.read_bytes()) for f in files]
    by_size = {}
    for b in batch_sizes:
        batch = np.stack([tensors[i % len(tensors)] for i in range(b)])  # (B, C, H, W)
        if sessions == 1:

            def step(batch: np.ndarray = batch) -> int:
                runners[0].run(batch)
                return len(batch)

            done, elapsed = _timed(step, seconds)
            by_size[b] = done / elapsed
        else:
            by_size[b] = measure_point([runner.run for runner in runners], batch, seconds)
    best = max(by_size, key=by_size.get)
    return {
        "images_per_s": by_size[best],
        "best_batch_size": best,
        "by_batch_size": by_size,
        "provider": runners[0].providers.primary,
        "sessions": sessions,
        "intra_op_threads": threads,
    }


def ort_best(model_dir: Path, files: Sequence[Path], *, seconds: float, cores: int) -> dict:
    """(a) on the CPU: the better of one default session and ``cores`` one-thread sessions side by side.

    Returns:
        The better :func:`ort_best_batch` result, with ``"configurations"``: both results
        (only the first when ``cores`` is 1).
    """
    tried = [ort_best_batch(model_dir, files, seconds=seconds)]
    if cores > 1:
        tried.append(ort_best_batch(model_dir, files, seconds=seconds, sessions=cores))
    best = max(tried, key=lambda r: r["images_per_s"])
    return best | {"configurations": tried}


def decode_and_run(
    model_dir: Path, files: Sequence[Path], *, seconds: float, decode_threads: int = 0, device: str = "cpu"
) -> dict:
    """(b) decode, preprocess and run one image at a time, in process.

    ``decode_threads`` 0: everything in one thread, one image after another. N > 0: decoding
    spread over N threads (a bounded pipeline), ORT still one image at a time.

    Returns:
        ``{"images_per_s": ..., "decode_ms": mean decode + preprocess time per image (sequential only)}``.
    """
    runner = _runner(model_dir, device)
    preprocessor = preprocessor_for(model_dir)
    payloads = [f.read_bytes() for f in files]
    result: dict = {}
    if decode_threads == 0:
        decode_seconds = []

        def step() -> int:
            for data in payloads:
                started = time.perf_counter()
                x = decode(preprocessor, data)
                decode_seconds.append(time.perf_counter() - started)
                runner.run(x[None])
            return len(payloads)

        done, elapsed = _timed(step, seconds)
        result["decode_ms"] = 1e3 * float(np.mean(decode_seconds))
    else:
        with ThreadPoolExecutor(decode_threads) as pool:

            def step() -> int:
                for x in pool.map(lambda data: decode(preprocessor, data), payloads):
                    runner.run(x[None])
                return len(payloads)

            done, elapsed = _timed(step, seconds)
    result["images_per_s"] = done / elapsed
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    report = {
        "a_ort_best": ort_best(args.model_dir, args.files, seconds=args.seconds, cores=usable_cpus().cores),
        "b_decode_sequential": decode_and_run(args.model_dir, args.files, seconds=args.seconds),
        "b_decode_threads": decode_and_run(args.model_dir, args.files, seconds=args.seconds, decode_threads=2),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
