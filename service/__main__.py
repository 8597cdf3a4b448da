"""``python -m service``: start uvicorn with the settings from the environment.

Exits with status 2 and a message naming the variable, file or field when a setting or a
manifest is invalid, before any port is opened.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from service.app import validate_repository
from service.errors import RepositoryError
from service.settings import load_settings


def main() -> int:
    settings = load_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
    )
    try:
        validate_repository(settings)
    except RepositoryError as exc:
        print(f"patchserve: cannot start: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        "service.app:build_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
