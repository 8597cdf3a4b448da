"""Fast JSON responses (orjson) and the ``Server-Timing`` header, built once for every route."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

from service.pipeline.inference import ImageOutcome


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


def timings(outcomes: list[ImageOutcome]) -> dict[str, float]:
    """Decode, queue and compute seconds of a request, for ``Server-Timing``.

    With several images each figure is the largest among them (what the client waited for).
    An image padded to a bucket adds ``pad``: the share of its batch's compute spent on its
    padding, estimated as compute x its padded fraction (compute grows with the pixels run).
    """
    phases = {
        "decode": max(o.decode_seconds for o in outcomes),
        "queue": max((o.result.queue_seconds for o in outcomes if o.result), default=0.0),
        "compute": max((o.result.compute_seconds for o in outcomes if o.result), default=0.0),
    }
    padded = [o.result.compute_seconds * o.padding for o in outcomes if o.result and o.padding > 0]
    if padded:
        phases["pad"] = max(padded)
    return phases
