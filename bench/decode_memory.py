"""Decoding memory by kind of image: peak RSS growth of one 40 MP image decoded alone.

    python -m bench.decode_memory            # about 20 s; prints one line per kind

The worker's decoding budget (``PATCHSERVE_MAX_DECODING_PIXELS``) counts pixels, not bytes, so what
a pixel costs decides what the budget holds (docs/api.md, "Limits"). Each kind is a flat 6324x6324
picture (40,000,000 pixels, the default ``PATCHSERVE_MAX_IMAGE_PIXELS``) written by Pillow, and each
is decoded by :func:`service.imaging.images.decode_image` to grey (``"L"``, as ``vit-digits``) with
an 8x8 draft size (``--draft``), in a fresh Python process of its own, whose peak RSS (``VmHWM``,
reset through ``/proc/self/clear_refs`` just before) is read after it, less the RSS before it: the
growth is the decode's own peak, whatever the allocator keeps afterwards. A flat picture compresses
to tens of KB, which is what makes such a file a cheap thing to send.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image

SIDE = 6324
KINDS = (
    "8-bit grey PNG",
    "16-bit grey PNG",
    "16-bit grey PNG with a tRNS key",
    "8-bit RGBA PNG",
    "16-bit RGBA PNG",
    "8-bit RGB PNG",
    "lossless WebP",
    "lossless WebP, 2 frames",
)

_CHILD = """
import sys, time
from service.imaging.images import decode_image
def status(field):  # kB, from /proc/self/status
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))
data, side = sys.stdin.buffer.read(), int(sys.argv[1])
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak (VmHWM) starts again from the current RSS: an import's peak does not hide the decode's
before = status("VmRSS")
started = time.process_time()
decode_image(data, color_mode="L", max_pixels=40_000_000, draft_size=(side, side))
print((status("VmHWM") - before) * 1024, time.process_time() - started)
"""


def image_file(kind: str, side: int = SIDE) -> bytes:
    """One flat ``side`` x ``side`` file of ``kind`` (one of :data:`KINDS`): a PNG, or a WebP."""
    if "WebP" in kind:  # two flat colours: frames that differ, so the second is a frame of its own
        frames = [Image.new("RGB", (side, side), colour) for colour in ((90, 120, 200), (200, 120, 90))]
        buffer = io.BytesIO()
        animated = "frames" in kind
        frames[0].save(buffer, "WEBP", lossless=True, save_all=animated, append_images=frames[1:] if animated else [])
        return buffer.getvalue()
    if kind == "16-bit RGBA PNG":  # Pillow writes no 16-bit RGBA: the chunks are written here (PNG, Sec. 11.2.2)
        return _png_rgba16(side)
    if kind.startswith("16-bit"):
        image = Image.fromarray(np.full((side, side), 40_000, np.uint16))
        options = {"transparency": 40_000} if "tRNS" in kind else {}
    else:
        mode = {"8-bit grey PNG": "L", "8-bit RGBA PNG": "RGBA", "8-bit RGB PNG": "RGB"}[kind]
        image, options = Image.new(mode, (side, side), (90, 120, 200, 128)[: len(mode)]), {}
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **options)
    return buffer.getvalue()


def _png_rgba16(side: int) -> bytes:
    """A flat ``side`` x ``side`` PNG of colour type 6 (RGBA) at bit depth 16, all samples zero."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 16, 6, 0, 0, 0)
    packer, row = zlib.compressobj(6), b"\0" * (1 + 8 * side)  # filter byte 0 (None), then 8 bytes a pixel
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def measure(kind: str, draft: int = 8) -> dict:
    """Peak RSS growth (bytes, and bytes a pixel) and CPU seconds of decoding one ``kind`` in a fresh process,
    for a model whose input is ``draft`` x ``draft`` (8: ``vit-digits``; 224: ViT-B/16)."""
    data = image_file(kind)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(draft)], input=data, capture_output=True, check=True)
    grown, cpu = done.stdout.split()
    return {
        "kind": kind,
        "draft": draft,
        "file_bytes": len(data),
        "peak_growth_mib": round(int(grown) / 2**20, 1),
        "bytes_per_pixel": round(int(grown) / SIDE**2, 1),
        "cpu_seconds": round(float(cpu), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--draft", type=int, default=8, help="the model input's side the decode aims at")
    args = parser.parse_args(argv)
    for kind in args.kinds:
        print(json.dumps(measure(kind, args.draft)), flush=True)


if __name__ == "__main__":
    main()
