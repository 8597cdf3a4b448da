"""``python -m service.process.healthcheck``: exit 0 when the local server is ready, 1 otherwise.

The container's HEALTHCHECK (the slim images have no curl). Standard library only; asks
``/readyz`` at ``$PATCHSERVE_PORT`` (default 8000), with a 3-second timeout, on 127.0.0.1, or on
``$PATCHSERVE_HOST`` when that names one address rather than every one (a server bound to one
interface does not answer on the loopback).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def ready_url(environ: dict[str, str] | os._Environ[str]) -> str:
    """The ``/readyz`` URL of the server the environment configures."""
    host = environ.get("PATCHSERVE_HOST", "").strip()
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{environ.get('PATCHSERVE_PORT', '8000')}/readyz"


def main() -> int:
    url = ready_url(os.environ)
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"not ready: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
