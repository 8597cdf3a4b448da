"""The server's version: the installed distribution's, read from its metadata.

pyproject.toml's ``version`` is the one copy; FastAPI's OpenAPI ``info.version`` and the Open
Inference Protocol's server metadata (``GET /v2``) report it through :data:`VERSION`.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "patchserve"  # pyproject.toml's [project] name
UNINSTALLED = "0+unknown"  # a PEP 440 local version that no release has


def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The installed version of ``distribution``, or :data:`UNINSTALLED` when it is not installed.

    The fallback is for a source tree run without installing it (``PYTHONPATH=.``, a copied
    ``service/`` folder): the server still starts, and says plainly that its version is unknown
    rather than repeating a string that would drift from pyproject.toml. ``make serve``, the
    Docker images and ``pip install`` all install the distribution, so they report its version.
    """
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNINSTALLED


VERSION = installed_version()
