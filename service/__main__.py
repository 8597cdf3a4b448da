"""``python -m service``: serve with the settings from the environment (see :mod:`service.process.serve`).

Exits with status 2 and a message naming the variable, file or field when a setting or a
manifest is invalid, before any port is opened; with 0 after a SIGTERM has drained the server.
A ``PATCHSERVE_*`` variable that names no setting (a typo) is logged as a warning at start.
"""

from __future__ import annotations

import logging.config
import os
import sys

from service.core.logs import log_config
from service.core.settings import load_settings, unknown_variables


def main() -> int:
    settings = load_settings()
    logging.config.dictConfig(log_config(settings.log_level, settings.log_format))
    for line in unknown_variables(os.environ):  # once, here: every worker reads the settings again
        logging.getLogger("service").warning("%s", line)
    from service.process.serve import run  # here: prometheus_client must not be imported before run()

    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
