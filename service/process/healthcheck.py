"""``python -m service.process.healthcheck``: exit 0 when the local server is ready, 1 otherwise.

The container's HEALTHCHECK (the slim images have no curl). Standard library only; asks
``/readyz`` on 127.0.0.1 at ``$PATCHSERVE_PORT`` (default 8000), with a 3-second timeout.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = f"http://127.0.0.1:{os.environ.get('PATCHSERVE_PORT', '8000')}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"not ready: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
