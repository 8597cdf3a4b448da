"""An input's JSON ``data`` as a numpy array of its datatype: never a silent cast.

The protocol's JSON ``data`` of a numeric datatype holds numbers (Triton's parser refuses
``null``, booleans and strings there), and ``BOOL`` holds ``true`` and ``false``. numpy reads
JSON's own types first, so each refusal here is one numpy's conversion would have made
silently: ``[0, true]`` as ``[0, 1]``, ``1.9`` in an integer tensor as ``1``, ``2**63`` in
``INT64`` as ``-2**63``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.core.errors import BadRequest
from service.v2.literals import holds_a_boolean

_JSON_KINDS = {False: frozenset("iuf"), True: frozenset("b")}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise BadRequest(message)


def tensor_from_json(data: Any, name: str, datatype: str, dtype: np.dtype, *, literals: bool) -> np.ndarray:
    """``data`` (a JSON array, nested or flat) as an array of ``dtype``, in its own nesting's shape.

    Args:
        data: the input's ``data``, as parsed.
        name: the input's name, for messages.
        datatype: the protocol's datatype ("FP32", "INT64", "BOOL", ...), for messages.
        dtype: its numpy dtype.
        literals: the JSON spells ``true`` or ``false`` somewhere (a boolean may hide in a number tensor).

    Returns:
        The array (its shape is the nesting's; the caller checks the element count).

    Raises:
        BadRequest: an element of the wrong JSON type, a non-integer or out-of-range value for an
            integer datatype, or ragged nested lists (400).
    """
    try:
        inferred = np.asarray(data)  # JSON's own types first: null and true are not numbers
        numbers = datatype == "BOOL" or not (literals and holds_a_boolean(data))  # [0, true]: [0, 1]
        _require(
            inferred.size == 0 or (inferred.dtype.kind in _JSON_KINDS[datatype == "BOOL"] and numbers),
            f"input {name!r}: data is not a {datatype} tensor: its elements must all be "
            + ("true or false" if datatype == "BOOL" else "numbers (JSON null, booleans and strings are not)"),
        )
        if dtype.kind in "iu" and inferred.size:  # never a silent truncation or wrap-around
            limits = np.iinfo(dtype)
            if inferred.dtype.kind == "f":  # 1.9, or integers numpy could only hold together as floats
                _require(
                    bool(np.all(np.isfinite(inferred) & (inferred == np.trunc(inferred)))),
                    f"input {name!r}: data is not a {datatype} tensor: a value is not an integer",
                )
                # As Python's numbers, which compare exactly (2**64 - 1 beside 0 is a float to numpy)
                inferred = np.array(data, dtype=object)
                in_range = bool(np.all(inferred >= limits.min) and np.all(inferred <= limits.max))
            else:
                in_range = limits.min <= inferred.min() and inferred.max() <= limits.max
            _require(
                in_range,
                f"input {name!r}: data is not a {datatype} tensor: a value is outside [{limits.min}, {limits.max}]",
            )
        with np.errstate(over="ignore"):  # beyond a float's range: an infinity, as Triton's cast (1e39 in FP32)
            array = inferred.astype(dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        ragged = "inhomogeneous" in str(exc)  # numpy's words for nested lists of different lengths: say so
        fault = "its nested lists are ragged; send the values flat in row-major order" if ragged else str(exc)
        raise BadRequest(f"input {name!r}: data is not a {datatype} tensor: {fault}") from None
    return array
