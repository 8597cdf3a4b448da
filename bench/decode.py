"""What JPEG draft mode saves: decode + preprocess to the model input, with and without it.

    python -m bench.decode bench/.work/model_repository/vit-ti16-random/1 bench/.work/images/4000x3000/*.jpg

Draft mode asks libjpeg to scale the DCT by 1/2, 1/4 or 1/8 while decoding (the smallest
scale still at least the model's input size), so a 4000x3000 photo going to 224x224 is decoded
at 500x375 and never materialised at full size. Times are CPU seconds of this thread
(``time.thread_time``), the median over the files and repeats, so load from other processes
on the machine does not inflate them.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from bench.raw import preprocessor_for
from service.imaging.images import decode_image


def decode_cost(model_dir: Path, files: Sequence[Path], *, repeats: int = 3, full: bool = True) -> dict:
    """Median CPU milliseconds per image to decode and preprocess, draft mode on and off.

    Returns:
        ``{"draft_ms": ..., "full_ms": ..., "plain_decode_ms": ..., "draft_over_full": ...,
        "draft_over_plain_decode": ...}``: ``full`` is the same pipeline without draft mode,
        ``plain_decode`` only ``Image.open(...).load()`` at full size (no conversion, no resize).
        With ``full`` False, ``{"draft_ms": ...}`` alone (what the server does; the ceiling's cost).
    """
    preprocessor = preprocessor_for(model_dir)
    payloads = [f.read_bytes() for f in files]
    cost: dict[str, list[float]] = {"draft": [], "full": [], "plain": []}
    modes = (("draft", preprocessor.draft_size), ("full", None)) if full else (("draft", preprocessor.draft_size),)
    for mode, draft in modes:  # each mode a series of its own: between full-size decodes the draft ones
        for _ in range(repeats):  # took 14.3 ms at 4000x3000, alone 9.2-12.6 (2026-12-07, docs/performance.md)
            for data in payloads:
                started = time.thread_time()
                image = decode_image(
                    data, color_mode=preprocessor.spec.color_mode, max_pixels=40_000_000, draft_size=draft
                )
                preprocessor(image.image)
                cost[mode].append(time.thread_time() - started)
    for _ in range(repeats if full else 0):
        for data in payloads:
            started = time.thread_time()
            Image.open(io.BytesIO(data)).load()
            cost["plain"].append(time.thread_time() - started)
    if not full:
        return {"draft_ms": statistics.median(cost["draft"]) * 1e3}
    draft, full_ms, plain = (statistics.median(cost[mode]) * 1e3 for mode in ("draft", "full", "plain"))
    return {
        "draft_ms": draft,
        "full_ms": full_ms,
        "plain_decode_ms": plain,
        "draft_over_full": draft / full_ms,
        "draft_over_plain_decode": draft / plain,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)
    print(json.dumps(decode_cost(args.model_dir, args.files), indent=2))


if __name__ == "__main__":
    main()
