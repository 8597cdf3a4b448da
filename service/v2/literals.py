"""Triton's non-finite JSON literals: ``NaN``, ``Infinity`` and ``-Infinity``.

RFC 8259 JSON has no NaN, but Triton's JSON (rapidjson with ``kParseNanAndInfFlag`` and
``kWriteNanAndInfFlag``) reads and writes these literals, tritonclient sends them for non-finite
values in JSON ``data`` (``set_data_from_numpy(x, binary_data=False)``) and reads them back
(python-rapidjson). orjson, the server's JSON library, neither reads them nor writes them (it
writes ``null``); this module is the slow path for the bodies that have them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson

from service.core.errors import BadRequest
from service.core.json_bounds import V2_CONTAINERS, check_containers, check_values

_NON_FINITE = re.compile(rb"NaN|Infinity")


def load_json(header: bytes, *, binary_hint: bool = False, max_values: int | None = None) -> Any:
    """The JSON object of a request, with Triton's ``NaN``, ``Infinity`` and ``-Infinity`` literals.

    tritonclient sends them for non-finite values in JSON ``data`` and Triton's parser (rapidjson,
    ``kParseNanAndInfFlag``) reads them; orjson refuses them. orjson reads everything else: only a
    document it refuses that spells one of them is read again by Python's ``json`` (no larger: the
    body is already within its cap), then re-encoded by orjson, so that the literals are the only
    thing accepted beyond what orjson accepts (not lone surrogates, nor integers past 64 bits).

    Args:
        header: the request's JSON bytes (within the body cap).
        binary_hint: the request sent no ``Inference-Header-Content-Length``: bytes that are not
            UTF-8 are then likely binary tensors, and the 400 names the header.
        max_values: the most tensor values the model takes in one request (None: no bound known),
            checked by counting commas before parsing (:func:`~service.core.json_bounds.check_values`).

    Returns:
        The parsed document, non-finite literals as Python floats.

    Raises:
        BadRequest: not JSON, even with those literals, or more arrays and objects than
            :data:`~service.core.json_bounds.V2_CONTAINERS`, counted before parsing (400).
    """
    check_containers(
        header,
        V2_CONTAINERS,
        "send each input's data as one flat array in row-major order (as tritonclient does), or as binary "
        "data (Inference-Header-Content-Length)",
    )
    if max_values is not None:
        check_values(header, max_values, "the model's input takes no more in one request")
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        refusal = str(exc)  # not the error: its .doc, the whole body as a str, would live in a reference cycle
    if binary_hint and "not valid UTF-8" in refusal:  # orjson's words for bytes that are not text
        raise BadRequest(
            f"the inference request is not valid JSON: it is not UTF-8 text ({refusal}); a body of binary "
            "tensors needs the Inference-Header-Content-Length header"
        )
    if _NON_FINITE.search(header) is not None:
        try:
            document = json.loads(header.decode("utf-8"))  # decoded first: json.loads would guess UTF-16/32
            orjson.dumps(document)
            return document
        except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            pass
    raise BadRequest(f"the inference request is not valid JSON: {refusal}") from None


def with_literals(array: np.ndarray) -> bytes | None:
    """A float tensor with non-finite values as a JSON array with Triton's literals, else None.

    Triton writes NaN and infinities in JSON ``data`` as ``NaN``, ``Infinity`` and ``-Infinity``
    (rapidjson's ``kWriteNanAndInfFlag``), which tritonclient reads back as they were; orjson
    writes ``null``. Only an output that has such values takes this path: its finite elements are
    written by orjson (a flat array of numbers, so split at its commas) and the others replaced.

    Args:
        array: an output tensor, any shape and dtype.

    Returns:
        The JSON array of its elements, flat and row-major, as bytes; None when it is not a float
        tensor or all its values are finite (orjson writes it, strict JSON).
    """
    if array.dtype.kind != "f":
        return None
    flat = np.ascontiguousarray(array.ravel(), dtype=np.float32 if array.dtype == np.float16 else array.dtype)
    finite = np.isfinite(flat)
    if finite.all():
        return None
    zeroed = np.where(finite, flat, flat.dtype.type(0))
    elements = orjson.dumps(zeroed, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for index in np.flatnonzero(~finite):
        value = flat[index]
        elements[index] = b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"
    return b"[" + b",".join(elements) + b"]"


def holds_a_boolean(data: Any) -> bool:
    """Whether JSON ``data`` (numbers, or lists of them nested to any depth) holds ``true`` or ``false``.

    numpy reads ``[0, true]`` as the integers ``[0, 1]`` and ``[0.5, true]`` as floats, so a
    boolean mixed into a numeric tensor is found here, element by element: Triton's parser
    refuses it, and so does the protocol's ``data`` of a numeric datatype (one pass, no copy).
    """
    stack = [data]
    while stack:
        item = stack.pop()
        if type(item) is bool:
            return True
        if type(item) is list:
            for value in item:
                kind = type(value)
                if kind is bool:
                    return True
                if kind is list:
                    stack.append(value)
    return False
