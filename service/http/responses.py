"""Fast JSON responses (orjson) and the ``Server-Timing`` header, built once for every route."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class JSON(JSONResponse):
    """``application/json`` rendered with orjson (numpy scalars and arrays included)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def server_timing(**phases: float) -> str:
    """A ``Server-Timing`` header value (W3C Server Timing) from phase durations in seconds.

    ``server_timing(decode=0.0012, queue=0.0, compute=0.004)`` is
    ``"decode;dur=1.200, queue;dur=0.000, compute;dur=4.000"``: each ``dur`` in milliseconds,
    as the header's spec says, in the order given.
    """
    return ", ".join(f"{name};dur={seconds * 1e3:.3f}" for name, seconds in phases.items())
