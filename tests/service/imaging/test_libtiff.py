"""libtiff's messages are kept off stderr (service/imaging/libtiff.py)."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
from PIL import Image

from service.imaging.libtiff import loaded_libtiffs
from tests.conftest import ROOT

DECODE = """
import sys
from PIL import Image
if sys.argv[2] == "quiet":
    from service.imaging import libtiff
    assert libtiff.silence()
Image.open(sys.argv[1]).load()
"""


def corrupt_g4_tiff() -> bytes:
    """A 16x20000 CCITT G4 TIFF (one strip) with 30 bytes of its strip changed: libtiff reports bad code words."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.random((20000, 16)) > 0.5)
    out = io.BytesIO()
    image.save(out, "TIFF", compression="group4", tiffinfo={278: 20000})
    data = bytearray(out.getvalue())
    for at in rng.integers(len(data) // 2, len(data) - 400, 30):  # inside the strip, away from the IFD
        data[at] ^= 0xFF
    return bytes(data)


def test_a_corrupt_fax_tiff_prints_nothing_once_libtiff_is_quieted(tmp_path) -> None:
    # Found by a fresh user: one 1 MB request printed 4,530 "Fax4Decode: Bad code word" lines to
    # stderr, past the log level and the JSON log format.
    path = tmp_path / "bad.tif"
    path.write_bytes(corrupt_g4_tiff())
    loud, quiet = (
        subprocess.run([sys.executable, "-c", DECODE, str(path), mode], capture_output=True, text=True, cwd=ROOT)
        for mode in ("loud", "quiet")
    )
    assert loud.stderr.count("Bad code word") > 10  # the file does what the user's did
    assert "Bad code word" not in quiet.stderr and quiet.returncode == loud.returncode


def test_the_libtiff_pillow_loaded_is_found(tmp_path) -> None:
    from PIL import TiffImagePlugin  # noqa: F401

    assert any("libtiff" in path for path in loaded_libtiffs())
    (tmp_path / "maps").write_text("7f00-7f01 r-xp 00000000 08:01 1 /opt/lib/libtiff.so.6\n7f02-7f03 rw-p 0 0:0 0\n")
    assert loaded_libtiffs(tmp_path / "maps") == ["/opt/lib/libtiff.so.6"]
    assert loaded_libtiffs(tmp_path / "missing") == []
