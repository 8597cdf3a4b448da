"""Decoding memory by kind of image: peak RSS growth of one 40 MP image decoded alone.

    python -m bench.decode_memory            # about 20 s; prints one line per kind

The worker's decoding budget (``PATCHSERVE_MAX_DECODING_PIXELS``) counts pixels, not bytes, so
what a pixel costs decides what the budget holds (docs/api.md, "Limits"). Each kind is a flat
6324x6324 picture (40,000,000 pixels, the default ``PATCHSERVE_MAX_IMAGE_PIXELS``) written by
Pillow, and each is decoded by :func:`service.imaging.images.decode_image` to grey (``"L"``, as
``vit-digits``) with an 8x8 draft size, in a fresh Python process of its own, whose peak RSS
(``ru_maxrss``) is read before and after: the growth is the decode's own peak, whatever the
allocator keeps afterwards. A flat picture compresses to tens of KB, which is what makes such a
file a cheap thing to send.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys

import numpy as np
from PIL import Image

SIDE = 6324
KINDS = ("8-bit grey PNG", "16-bit grey PNG", "16-bit grey PNG with a tRNS key", "8-bit RGBA PNG", "8-bit RGB PNG")

_CHILD = """
import resource, sys, time
from service.imaging.images import decode_image
data = sys.stdin.buffer.read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.process_time()
decode_image(data, color_mode="L", max_pixels=40_000_000, draft_size=(8, 8))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, time.process_time() - started)
"""


def image_file(kind: str, side: int = SIDE) -> bytes:
    """One flat ``side`` x ``side`` PNG of ``kind`` (one of :data:`KINDS`)."""
    if kind.startswith("16-bit"):
        image = Image.fromarray(np.full((side, side), 40_000, np.uint16))
        options = {"transparency": 40_000} if "tRNS" in kind else {}
    else:
        mode = {"8-bit grey PNG": "L", "8-bit RGBA PNG": "RGBA", "8-bit RGB PNG": "RGB"}[kind]
        image, options = Image.new(mode, (side, side), (90, 120, 200, 128)[: len(mode)]), {}
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **options)
    return buffer.getvalue()


def measure(kind: str) -> dict:
    """Peak RSS growth (bytes, and bytes a pixel) and CPU seconds of decoding one ``kind`` in a fresh process."""
    data = image_file(kind)
    done = subprocess.run([sys.executable, "-c", _CHILD], input=data, capture_output=True, check=True)
    grown, cpu = done.stdout.split()
    return {
        "kind": kind,
        "file_bytes": len(data),
        "peak_growth_mib": round(int(grown) / 2**20, 1),
        "bytes_per_pixel": round(int(grown) / SIDE**2, 1),
        "cpu_seconds": round(float(cpu), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    args = parser.parse_args(argv)
    for kind in args.kinds:
        print(json.dumps(measure(kind)), flush=True)


if __name__ == "__main__":
    main()
