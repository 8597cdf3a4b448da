"""The Open Inference Protocol (KServe v2) over REST: tensors in, tensors out.

Parses an inference request body into numpy arrays and encodes the response, per the protocol
(kserve.github.io, "Open Inference Protocol (V2 Inference Protocol)": the inference request and
response JSON objects) and its binary tensor data extension (Triton's ``binary_tensor_data``):

* a tensor's ``data`` is JSON (flat or nested, row-major), or, when its ``parameters`` carry
  ``binary_data_size``, raw little-endian row-major bytes placed after the JSON object, whose
  length the ``Inference-Header-Content-Length`` header gives;
* an output is returned as binary when its request ``parameters`` say ``binary_data: true``, or,
  for outputs without that parameter, when the request's ``parameters`` say ``binary_data_output: true``;
* a ``BYTES`` element in binary is a 4-byte little-endian length and the bytes;
* an error is ``{"error": "<message>"}`` with a 4xx or 5xx status.

A body with ``Content-Encoding: gzip`` or ``deflate`` (tritonclient's compression) is inflated, never past the cap.
"""

from __future__ import annotations

import math
import re
import secrets
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from service.core.codings import content_coding, shown
from service.core.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from service.v2.json_data import tensor_from_json
from service.v2.literals import load_json, with_literals

HEADER_LENGTH = "Inference-Header-Content-Length"

# Protocol datatype -> numpy dtype, little-endian as the binary extension requires.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BYTES = "BYTES"

# ONNX Runtime's type strings (``NodeArg.type``) -> protocol datatypes.
ORT_DATATYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": BYTES,
}
_DECIMAL = re.compile(r"[0-9]{1,19}")  # a length in ASCII digits, at most 19 (below int()'s digit limit)
# numpy's own limit on dimensions (NPY_MAXDIMS in numpy 2); a tensor shape beyond it is a 400.
MAX_DIMS = 64
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


# numpy kinds that a JSON ``data`` array may infer to: numbers (ints and floats; a boolean mixed
# in among numbers is promoted by numpy and not caught), or for BOOL booleans only. None, a string
# or a ragged list infers to object or unicode and is refused, as Triton's parser refuses them.


def datatype_of(dtype: np.dtype) -> str:
    """The protocol datatype of a numpy dtype (object arrays of bytes are ``BYTES``).

    Raises:
        ValueError: a dtype the protocol has no name for.
    """
    if dtype == np.dtype(object):
        return BYTES
    for name, known in DATATYPES.items():
        if np.dtype(dtype).newbyteorder("<") == known:
            return name
    raise ValueError(f"no protocol datatype for numpy dtype {dtype}")


@dataclass(frozen=True)
class RequestedOutput:
    """One entry of the request's ``outputs``.

    Attributes:
        name: the output tensor's name.
        binary: return it as binary data (else JSON).
        classification: the classification extension's ``class_count``: 0 returns the raw
            tensor, k > 0 the k highest entries of each row as ``BYTES`` "value:index[:label]".
    """

    name: str
    binary: bool
    classification: int = 0


@dataclass(frozen=True)
class InferRequest:
    """A parsed inference request.

    Attributes:
        id: the client's request id, echoed in the response (None when absent).
        inputs: each input tensor by name, shaped as the request said, in the request's dtype.
        outputs: the outputs asked for, in order; None (absent or ``[]``, as Triton): every output of the model.
        binary_output: the request-level ``binary_data_output`` parameter (default False).
        parameters: the request-level parameters as sent.
        timeout: the request-level ``timeout`` parameter (Triton's, sent in microseconds) in
            seconds; None when absent or 0 (no timeout of its own).
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None
    binary_output: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None


@dataclass(frozen=True)
class OutputTensor:
    """One tensor of the response: a numeric array, or an object array of ``bytes`` (BYTES)."""

    name: str
    array: np.ndarray
    binary: bool


MAX_GZIP_MEMBERS = 64  # a gzip body's members (clients send one): each is a pass of Python holding a decode thread


def inflate(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding`` (identity, gzip or deflate), never inflating past ``max_bytes``.

    A gzip body may hold members one after another (RFC 1952, Sec. 2.2), :data:`MAX_GZIP_MEMBERS` at most.

    Raises:
        UnsupportedMediaType: an encoding other than identity, gzip or deflate (415).
        PayloadTooLarge: the inflated body is larger than ``max_bytes`` (413).
        BadRequest: the compressed data is corrupt, or bytes follow a stream that start no member (400).
    """
    encoding = content_coding(content_encoding)
    if encoding is None:
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"Content-Encoding {shown(encoding)} is not supported; use gzip, deflate or none")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS  # gzip, or zlib
    data, rest = b"", body
    for _ in range(MAX_GZIP_MEMBERS):
        inflater = zlib.decompressobj(wbits)
        try:
            data += inflater.decompress(rest, max_bytes + 1 - len(data))
        except zlib.error as exc:
            raise BadRequest(f"the {encoding} body could not be decompressed: {exc}") from None
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"the decompressed body is over the limit of {max_bytes} bytes")
        if not inflater.eof:
            raise BadRequest(f"the {encoding} body ends before its end of stream (truncated or corrupt)")
        rest = inflater.unused_data
        if not rest:
            return data
        if encoding != "gzip" or not rest.startswith(b"\x1f\x8b"):  # RFC 1952, Sec. 2.2: members follow members
            raise BadRequest(f"the {encoding} body has {len(rest)} bytes after its end of stream")
    raise BadRequest(f"the gzip body has more than {MAX_GZIP_MEMBERS} members (RFC 1952, Sec. 2.2); send one")


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if not _DECIMAL.fullmatch(header_length.strip()):  # not isdigit(): "²" is a digit that int() refuses
        shown = header_length if len(header_length) <= 40 else header_length[:40] + "..."
        raise BadRequest(f"{HEADER_LENGTH} {shown!r} is not a non-negative integer")
    length = int(header_length)
    if length == 0 or length > len(body):
        raise BadRequest(f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes")
    return body[:length], memoryview(body)[length:]


_MAX_TENSOR_BYTES = 2**40  # far above any body the server accepts, far below numpy's (2**63) overflow


def _shown(shape: list[int]) -> str:
    """A shape for a message, with any dimension of more than 20 digits elided."""
    return "[" + ", ".join(str(d) if d < 10**20 else f"<{len(str(d))} digits>" for d in shape) + "]"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise BadRequest(message)


def _parameters(entry: dict[str, Any], where: str) -> dict[str, Any]:
    parameters: dict[str, Any] = entry.get("parameters", {})
    _require(isinstance(parameters, dict), f"{where}.parameters must be an object")
    if any(key in parameters for key in _SHARED_MEMORY):
        raise BadRequest(f"{where}: shared-memory tensors are not supported by this server; send the data")
    return parameters


def _read_input(entry: Any, index: int, binary: memoryview, offset: int, literals: bool) -> tuple[str, np.ndarray, int]:
    """One ``$request_input`` -> (name, array, new offset); ``literals``: the JSON spells true or false somewhere."""
    where = f"inputs[{index}]"
    _require(isinstance(entry, dict), f"{where} must be an object")
    name, shape, datatype = entry.get("name"), entry.get("shape"), entry.get("datatype")
    _require(isinstance(name, str) and bool(name), f"{where}.name must be a non-empty string")
    _require(
        isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape),
        f"input {name!r}: shape must be a list of non-negative integers",
    )
    if datatype == BYTES:
        raise BadRequest(f"input {name!r}: BYTES inputs are not supported; the models here take numeric tensors")
    what = "no datatype" if datatype is None else f"unknown datatype {str(datatype)[:40]!r}"  # (a list: no 500)
    _require(isinstance(datatype, str) and datatype in DATATYPES, f"input {name!r}: {what}; one of {sorted(DATATYPES)}")
    dtype = DATATYPES[datatype]
    _require(len(shape) <= MAX_DIMS, f"input {name!r}: shape has {len(shape)} dimensions; at most {MAX_DIMS}")
    count = math.prod(shape)
    # A zero-element tensor may still declare huge dimensions ([0, 2**63]), which numpy cannot
    # represent: bound what the non-zero dimensions multiply to, as if the tensor held data.
    nonzero = math.prod(d for d in shape if d)
    _require(
        nonzero * dtype.itemsize <= _MAX_TENSOR_BYTES,
        f"input {name!r}: shape {_shown(shape)} is larger than any tensor this server takes",
    )
    parameters = _parameters(entry, f"input {name!r}")
    size = parameters.get("binary_data_size")
    # Exclusive, as Triton's ValidateInputContentType has it: with both, which one the model ran on
    # would be the server's silent choice.
    _require(
        "binary_data_size" not in parameters or size is not None,
        f"input {name!r}: binary_data_size is null; give its binary data's size in bytes, or leave it out",
    )
    _require(
        "binary_data_size" not in parameters or "data" not in entry,
        f"input {name!r} has both data and parameters.binary_data_size; send exactly one of them "
        "(JSON data, or binary data after the JSON)",
    )
    if size is not None:
        _require(
            isinstance(size, int) and not isinstance(size, bool) and size >= 0, f"input {name!r}: bad binary_data_size"
        )
        _require(
            size == count * dtype.itemsize,
            f"input {name!r}: binary_data_size is {size} bytes but shape {shape} of {datatype} needs "
            f"{count * dtype.itemsize}",
        )
        _require(offset + size <= len(binary), f"input {name!r}: the body ends before its {size} bytes of data")
        array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
        return name, array, offset + size
    _require("data" in entry, f"input {name!r} has neither data nor parameters.binary_data_size")
    array = tensor_from_json(entry["data"], name, datatype, dtype, literals=literals)
    _require(
        array.size == count,
        f"input {name!r}: data has {array.size} elements but shape {shape} needs {count}",
    )
    return name, array.reshape(shape), offset


def _read_output(entry: Any, index: int, binary_default: bool) -> RequestedOutput:
    where = f"outputs[{index}]"
    _require(isinstance(entry, dict), f"{where} must be an object")
    name = entry.get("name")
    _require(isinstance(name, str) and bool(name), f"{where}.name must be a non-empty string")
    parameters = _parameters(entry, f"output {name!r}")
    binary = parameters.get("binary_data", binary_default)
    _require(isinstance(binary, bool), f"output {name!r}: binary_data must be true or false")
    count = parameters.get("classification", 0)
    _require(
        isinstance(count, int) and not isinstance(count, bool) and count >= 0,
        f"output {name!r}: classification must be a non-negative integer (the class count)",
    )
    return RequestedOutput(name, binary, count)


def parse_infer_request(body: bytes, header_length: str | None, max_values: int | None = None) -> InferRequest:
    """Parse an ``$inference_request`` body (JSON, then any binary tensor data).

    Args:
        body: the (inflated) request body.
        header_length: the ``Inference-Header-Content-Length`` header, or None when the JSON
            object is the whole body.
        max_values: the most values the model's inputs take in a request (:func:`load_json`).

    Returns:
        The request with every input as a numpy array of its declared shape and datatype.

    Raises:
        BadRequest: malformed JSON, missing or wrong fields, data that does not match its shape
            or datatype, binary sizes that do not add up, shared-memory tensors (400).
    """
    header, binary = _split_body(body, header_length)
    document = load_json(header, binary_hint=header_length is None, max_values=max_values)
    _require(isinstance(document, dict), "the inference request must be a JSON object")
    request_id = document.get("id")
    _require(request_id is None or isinstance(request_id, str), "id must be a string")
    parameters = _parameters(document, "the request")
    binary_output = parameters.get("binary_data_output", False)
    _require(isinstance(binary_output, bool), "parameters.binary_data_output must be true or false")
    timeout_us = parameters.get("timeout", 0)
    _require(
        isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and 0 <= timeout_us < 2**63,
        f"parameters.timeout must be a non-negative integer number of microseconds below 2**63 (JSON numbers "
        f"beyond it read as floats), not {timeout_us!r:.40}",
    )

    entries = document.get("inputs")
    _require(isinstance(entries, list) and bool(entries), "inputs must be a non-empty list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for index, entry in enumerate(entries):
        name, array, offset = _read_input(entry, index, binary, offset, b"true" in header or b"false" in header)
        _require(name not in inputs, f"input {name!r} is given twice")
        inputs[name] = array
    _require(offset == len(binary), f"{len(binary) - offset} bytes of binary data follow the tensors unclaimed")

    outputs = None
    if "outputs" in document:
        _require(isinstance(document["outputs"], list), "outputs must be a list")
        outputs = [_read_output(entry, i, binary_output) for i, entry in enumerate(document["outputs"])]
        names = [o.name for o in outputs]
        _require(len(set(names)) == len(names), "an output is requested twice")
    return InferRequest(request_id, inputs, outputs or None, binary_output, parameters, timeout_us / 1e6 or None)


def _bytes_element(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _binary(array: np.ndarray) -> bytes:
    if array.dtype == np.dtype(object):
        return b"".join(struct.pack("<I", len(b)) + b for b in map(_bytes_element, array.ravel()))
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _json_data(array: np.ndarray) -> Any:
    if array.dtype == np.dtype(object):
        return [_bytes_element(v).decode("utf-8", errors="replace") for v in array.ravel()]
    if array.dtype == np.float16:  # orjson writes float32/64 arrays natively, not float16
        array = array.astype(np.float32)
    return np.ascontiguousarray(array.ravel())


def encode_infer_response(
    model_name: str, model_version: str, request_id: str | None, outputs: list[OutputTensor]
) -> tuple[bytes, dict[str, str]]:
    """Encode an ``$inference_response``.

    Returns:
        (body, headers). With any binary output the body is the JSON object followed by the
        outputs' bytes in order, and the headers carry ``Inference-Header-Content-Length``
        and ``Content-Type: application/octet-stream``; otherwise it is JSON alone. A JSON
        output's NaN and infinities are written as Triton writes them, ``NaN``, ``Infinity``
        and ``-Infinity`` (read by tritonclient and Python's ``json``, not by strict parsers).
    """
    entries, chunks = [], []
    literals: dict[bytes, bytes] = {}
    for output in outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": datatype_of(output.array.dtype),
            "shape": list(output.array.shape),
        }
        if output.binary:
            chunk = _binary(output.array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            literal = with_literals(output.array)
            if literal is None:
                entry["data"] = _json_data(output.array)
            else:  # a unique placeholder, replaced by the array once orjson has written the rest
                placeholder = f"patchserve-data-{secrets.token_hex(16)}"
                entry["data"] = placeholder
                literals[orjson.dumps(placeholder)] = literal
        entries.append(entry)
    document: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request_id is not None:
        document["id"] = request_id
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    for placeholder_json, literal in literals.items():
        header = header.replace(placeholder_json, literal, 1)
    if not chunks:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(header)),
    }
