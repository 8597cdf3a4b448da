"""A bound on what parsing a JSON body costs, checked before it is parsed.

orjson builds the whole document as Python objects while it holds the GIL, so nothing else in
the worker runs meanwhile, its event loop and ``/healthz`` included. Numbers and strings cost
about their size (a 20 MB array of ten million zeros: 0.45 s), but each array or object costs
about ten times a number, and its memory more: twenty megabytes of ``[],`` are seven million
empty lists, 3.4 s of a stalled worker and 700 MiB (found by a tester, 2026-12-06). The
documents a route takes need few containers: ``{"images": [...]}`` on /v1, ``{"parameters":
{...}}`` on /v2/repository, and on /v2's infer one ``data`` array per input, flat as tritonclient
sends it (a nested one needs an array per row of its innermost dimension). So the brackets and
braces are counted first (``bytes.count``: about 16 ms for 20 MB; those inside strings count
too, which only ever over-counts) and a body with more than its route allows is refused before
it is parsed. Where a route knows the most values a request can carry (a /v2 model whose input
has a fixed size), the commas are counted too, which bounds the parse of a flat array as well.
"""

from __future__ import annotations

from service.core.errors import BadRequest

V1_CONTAINERS = 8  # {"images": [...]} is two; the rest lets a wrong document get its own, clearer 400
CONTROL_CONTAINERS = 64  # /v2/repository bodies: {"parameters": {...}}, a config as a JSON string
V2_CONTAINERS = 65_536  # a nested [64, 3, 224, 224] tensor is 43,265 arrays; parsing 65,536 takes ~10 ms


def check_containers(body: bytes, limit: int, advice: str) -> None:
    """Refuse ``body`` when it holds more than ``limit`` JSON arrays and objects.

    Args:
        body: the JSON text, not parsed yet.
        limit: most ``[`` and ``{`` characters together.
        advice: what the client should send instead (the end of the 400's detail).

    Raises:
        BadRequest: over the limit (400), with the count and ``advice``.
    """
    if len(body) <= limit:  # fewer bytes than the limit: nothing to count
        return
    containers = body.count(b"[") + body.count(b"{")
    if containers > limit:
        raise BadRequest(f"the JSON body holds {containers} arrays and objects, more than {limit} allowed; {advice}")


STRUCTURE_COMMAS = 1024  # commas a /v2 document spends between its fields, names and parameters


def check_values(body: bytes, limit: int, advice: str) -> None:
    """Refuse ``body`` when its commas say it holds more than ``limit`` values (and the fields').

    Raises:
        BadRequest: more than ``limit + STRUCTURE_COMMAS`` commas (400), with ``advice``.
    """
    if len(body) <= limit + STRUCTURE_COMMAS:
        return
    commas = body.count(b",")
    if commas > limit + STRUCTURE_COMMAS:
        raise BadRequest(f"the JSON body holds about {commas} values, more than {limit}; {advice}")
