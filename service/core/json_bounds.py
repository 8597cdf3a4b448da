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
it is parsed. An object's members cost about as much as containers (a dict entry and a key
string each: twenty megabytes of ``"1e8480":0,`` in one object stalled a worker 5 s and took 400
MiB, found by a second tester), and no route's document needs many, so the colons are counted
the same way (:data:`MEMBERS`). Where a route knows the most values a request can carry (a /v2
model whose input has a fixed size), the commas are counted too, which bounds the parse of a
flat array as well.
"""

from __future__ import annotations

from service.core.errors import BadRequest

V1_CONTAINERS = 8  # {"images": [...]} is two; the rest lets a wrong document get its own, clearer 400
CONTROL_CONTAINERS = 64  # /v2/repository bodies: {"parameters": {...}}, a config as a JSON string
V2_CONTAINERS = 65_536  # a nested [64, 3, 224, 224] tensor is 43,265 arrays; parsing 65,536 takes ~10 ms
MEMBERS = 4096  # object members (``:``) any route's document may hold; each needs a handful (/v2 infer: ~5 an input)


def check_containers(body: bytes, limit: int, advice: str) -> None:
    """Refuse ``body`` when it holds more than ``limit`` JSON arrays and objects, or more than
    :data:`MEMBERS` object members.

    Args:
        body: the JSON text, not parsed yet.
        limit: most ``[`` and ``{`` characters together.
        advice: what the client should send instead (the end of the 400's detail).

    Raises:
        BadRequest: over either limit (400), with the count and ``advice``.
    """
    if len(body) > limit and (containers := body.count(b"[") + body.count(b"{")) > limit:
        raise BadRequest(f"the JSON body holds {containers} arrays and objects, more than {limit} allowed; {advice}")
    if len(body) > MEMBERS and (members := body.count(b":")) > MEMBERS:  # (each member has one; strings may add some)
        raise BadRequest(
            f"the JSON body holds about {members} object members (counted by their ':'), more than {MEMBERS} allowed; "
            f"{advice}"
        )


PARSE_ON_LOOP_BYTES = 64 * 1024  # bodies up to this size are parsed on the event loop (a millisecond at most)
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
        raise BadRequest(
            f"the JSON body has {commas} commas, more than the {limit + STRUCTURE_COMMAS} its values can take "
            f"({limit} values and {STRUCTURE_COMMAS} for its fields; counted before parsing); {advice}"
        )
