"""Quiet libtiff: its error and warning handlers print every message to the process's stderr.

Pillow decodes compressed TIFFs with libtiff, whose default handlers write each message to
stderr, bypassing logging (``PATCHSERVE_LOG_LEVEL``, the JSON format): a fresh user's 1 MB
CCITT G4 TIFF with thirty bytes changed printed 4,530 ``Fax4Decode: Bad code word`` lines for one
request, so a client could fill a server's logs at will. Pillow learns of a failed decode from
libtiff's return codes (a broken file is still a 415), not from these messages, so the handlers
are set to none (``TIFFSetErrorHandler``, ``TIFFSetWarningHandler``; libtiff's ``tif_error.c``)
in the libtiff that Pillow has loaded: its wheel's bundled copy, or the system's.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def loaded_libtiffs(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """Paths of the libtiff shared objects mapped into this process (none where there is no /proc)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    paths = {line.split()[-1] for line in lines if len(line.split()) >= 6}
    return sorted(p for p in paths if Path(p).name.startswith("libtiff"))


def silence() -> list[str]:
    """Set libtiff's error and warning handlers to none in every libtiff Pillow has loaded; their paths."""
    from PIL import TiffImagePlugin  # noqa: F401  (loads Pillow's _imaging, which loads libtiff)

    quieted = []
    for path in loaded_libtiffs():
        try:
            library = ctypes.CDLL(path)
            library.TIFFSetErrorHandler(None)
            library.TIFFSetWarningHandler(None)
        except (OSError, AttributeError) as exc:
            log.warning("libtiff at %s could not be quieted (%s): its messages go to stderr", path, exc)
            continue
        quieted.append(path)
    return quieted
