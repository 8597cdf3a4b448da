"""Raw-tensor inference for the Open Inference Protocol: check, split, batch, reassemble.

A request's input tensor (B, C, H, W) is checked against the model's manifest, split into its
B rows, and each row is submitted to the model version's batcher like one decoded image of
``/v1`` (so tensors and images share batches); the rows' outputs are stacked back into
(B, ...) tensors in request order. No preprocessing and no post-processing: the client sends
the graph's input and gets the graph's outputs, as with Triton.

Non-finite inputs (NaN, infinities) are run, as Triton runs them: perf_analyzer's default
random data is random bytes, many of which are NaN in FP32. A row's values never reach its
batch mates (each output row depends on its input row only), and the outputs they give are
returned as they are: bit for bit in binary, and in JSON as Triton writes them, ``NaN``,
``Infinity`` and ``-Infinity`` (``protocol.encode_infer_response``; not RFC 8259 JSON, which
has no NaN, but what tritonclient reads).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from service import tasks
from service.batching.config import InferenceResult
from service.core.errors import BadRequest, ProblemError
from service.imaging import resize as policies
from service.pipeline.inference import observe_padding
from service.runtime.repository import ModelVersion
from service.tasks import classification
from service.v2.protocol import ORT_DATATYPES, InferRequest, OutputTensor, RequestedOutput, datatype_of


@dataclass(frozen=True)
class TensorOutcome:
    """The outputs of one request and how long its rows waited and ran.

    Attributes:
        outputs: the tensors to return, in the order asked for.
        queue_seconds: the longest time a row waited in the batcher's queue.
        compute_seconds: the longest model run among the row's batches.
    """

    outputs: list[OutputTensor]
    queue_seconds: float
    compute_seconds: float


def dims(shape: list[int | str]) -> list[int]:
    """A manifest or ONNX shape in protocol form: symbolic axes become -1."""
    return [d if isinstance(d, int) else -1 for d in shape]


def max_values(model: ModelVersion, max_rows: int) -> int | None:
    """The most values ``max_rows`` rows of the model's input (and pixel mask) hold; None: a size is free."""
    per_row = dims(model.manifest.input.shape)[1:]
    if any(d < 1 for d in per_row):
        return None
    pixels = per_row[-2] * per_row[-1] if mask_input(model) and len(per_row) >= 2 else 0
    return max_rows * (int(np.prod(per_row)) + pixels)


def input_datatype(model: ModelVersion) -> str:
    """The protocol datatype of the model's image input ("FP32" or "FP16")."""
    return {"float32": "FP32", "float16": "FP16"}[model.manifest.input.dtype]


def mask_input(model: ModelVersion) -> list[str]:
    """The graph's optional ``pixel_mask`` input, as a list of its name (empty: the graph has none).

    Optional as in Triton's ``optional: true``: a request without it runs with every pixel valid.
    """
    return [model.manifest.pixel_mask] if model.manifest.pixel_mask else []


def output_specs(model: ModelVersion) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape with -1 for symbolic axes) of each output the manifest lists."""
    graph = {o.name: o for o in model.runner.session.get_outputs()}
    return [
        (
            name,
            ORT_DATATYPES.get(graph[name].type, "FP32"),
            dims([d if d is not None else "?" for d in graph[name].shape]),
        )
        for name in model.manifest.outputs
        if name in graph
    ]


def _checked_input(model: ModelVersion, request: InferRequest, max_rows: int) -> np.ndarray:
    spec = model.manifest.input
    unknown = sorted(set(request.inputs) - {spec.name, *mask_input(model)})
    if unknown:
        names = [repr(n) for n in (spec.name, *mask_input(model))]
        its = f"its inputs are {' and '.join(names)}" if len(names) > 1 else f"its input is {names[0]}"
        raise BadRequest(f"model {model.name!r} has no input {unknown[0]!r}; {its}")
    if spec.name not in request.inputs:
        raise BadRequest(f"input {spec.name!r} is missing")
    x = request.inputs[spec.name]
    expected = input_datatype(model)
    if x.dtype != np.dtype(spec.dtype):
        raise BadRequest(f"input {spec.name!r} is {datatype_of(x.dtype)}; the model takes {expected}")
    shape = dims(spec.shape)
    mismatch = f"input {spec.name!r} has shape {list(x.shape)}; the model takes {shape} (-1: any size >= 1)"
    if x.ndim != len(shape):
        raise BadRequest(mismatch)
    if not 1 <= x.shape[0] <= max_rows:
        raise BadRequest(f"input {spec.name!r}: the batch size must be between 1 and {max_rows}, got {x.shape[0]}")
    for axis, (got, want) in enumerate(zip(x.shape[1:], shape[1:], strict=True), start=1):
        if (want != -1 and got != want) or got < 1:
            raise BadRequest(f"{mismatch}, axis {axis} differs")
    return x  # NaN and infinities are accepted, as Triton accepts them (see the module docstring)


def _valid_sizes(model: ModelVersion, request: InferRequest, x: np.ndarray) -> list[tuple[int, int]] | None:
    """Each row's (h, w) of real pixels from the request's ``pixel_mask``; None for a graph without one.

    The mask must be 1 on a top-left rectangle and 0 elsewhere, as an image processor pads
    (bottom and right); without a mask every pixel is real.

    Raises:
        BadRequest: a mask of another datatype or shape, or one that is not such a rectangle.
    """
    names = mask_input(model)
    if not names:
        return None
    b, _, height, width = x.shape
    mask = request.inputs.get(names[0])
    if mask is None:
        return [(height, width)] * b
    if mask.dtype != np.int64 or mask.shape != (b, height, width):
        raise BadRequest(
            f"input {names[0]!r} must be INT64 of shape {[b, height, width]} (the pixel values' B, H, W); got "
            f"{datatype_of(mask.dtype)} {list(mask.shape)}"
        )
    sizes = []
    for i, row in enumerate(mask):
        h, w = int(np.count_nonzero(row[:, 0])), int(np.count_nonzero(row[0]))
        expected = np.zeros_like(row)
        expected[:h, :w] = 1
        if h == 0 or w == 0 or not np.array_equal(row, expected):
            raise BadRequest(f"input {names[0]!r}: row {i} is not 1 on a top-left rectangle and 0 elsewhere")
        sizes.append((h, w))
    return sizes


def _checked_extent(model: ModelVersion, height: int, width: int, what: str) -> None:
    """Refuse an input larger than the model's preprocessing ever makes (a model with symbolic H and W).

    A detector's graph takes any H x W, but its cost grows with H x W (quadratically in the
    transformer's attention): the bound is the resize policy's largest output (``bounds``), as
    for ``/v1``, where an image is resized before it is run.

    Raises:
        BadRequest: ``height`` x ``width`` fits none of those sizes (400).
    """
    spec = model.preprocessor.spec
    bounds = policies.get(spec.resize).bounds(spec)
    if bounds is not None and not any(h >= height and w >= width for h, w in bounds):
        largest = ", ".join(f"{h}x{w}" for h, w in bounds)
        raise BadRequest(
            f"{what} is {height}x{width} (HxW), larger than model {model.name!r} takes: at most {largest}; "
            f"resize it as the model's preprocessing does (GET /v1/models/{model.name})"
        )


def _bucket(model: ModelVersion, height: int, width: int, row: int) -> tuple[int, int]:
    """(H, W) of the padding bucket a row of ``height`` x ``width`` real pixels joins.

    The model's first bucket that holds it, as ``/v1`` pads a resized image, so that a tensor
    gets the answer its image gets on ``/v1`` (the backbone's convolutions see the padding
    near the bottom and right edges, so an image's bucket, never its batch mates, is part of
    its answer).

    Raises:
        BadRequest: no bucket holds it (400, naming the buckets).
    """
    try:
        bucket = model.preprocessor.spec.bucket_for(height, width)
    except ValueError:
        buckets = ", ".join(f"{b.height}x{b.width}" for b in model.preprocessor.spec.buckets or [])
        raise BadRequest(
            f"row {row} has {height}x{width} (HxW) real pixels, which fit none of model {model.name!r}'s padding "
            f"buckets ({buckets}); resize it as the model's preprocessing does (GET /v1/models/{model.name})"
        ) from None
    assert bucket is not None  # a caller asks only for a model with buckets
    return bucket


def _row_buckets(model: ModelVersion, sizes: list[tuple[int, int]], height: int, width: int) -> list[tuple[int, int]]:
    """(H, W) each masked row is padded to, every row checked before any is run.

    The bucket ``/v1`` pads the row's image to (:func:`_bucket`; the padding observed in
    ``patchserve_padding_fraction``, as for an image), or, for a model without buckets, the
    tensor's own ``height`` x ``width`` (within the model's extent, :func:`_checked_extent`).

    Raises:
        BadRequest: as :func:`_bucket` and :func:`_checked_extent` (400).
    """
    if model.preprocessor.spec.buckets is None:
        _checked_extent(model, height, width, f"input {model.manifest.input.name!r}")
        return [(height, width)] * len(sizes)
    buckets = [_bucket(model, h, w, i) for i, (h, w) in enumerate(sizes)]
    for (h, w), bucket in zip(sizes, buckets, strict=True):
        observe_padding(model, h, w, bucket)
    return buckets


def _classify(values: np.ndarray, count: int, labels: list[str]) -> np.ndarray:
    """The classification extension: each row's ``count`` highest values as "value:index[:label]".

    Args:
        values: (B, N) scores as the graph outputs them (raw, as Triton does: no softmax).
        count: how many per row; clamped to N.
        labels: index -> name, used when it has N entries.

    Returns:
        object array (B, min(count, N)) of bytes, highest first, ties by lower index.
    """
    k = min(count, values.shape[1])
    named = len(labels) == values.shape[1]
    rows = []
    for row in values:
        order = np.argsort(-row, kind="stable")[:k]
        rows.append([f"{row[i]:f}:{i}{':' + labels[i] if named else ''}".encode() for i in order])
    out = np.empty((values.shape[0], k), dtype=object)
    out[:] = rows
    return out


def _requested(model: ModelVersion, request: InferRequest) -> list[RequestedOutput]:
    if request.outputs is None:
        return [RequestedOutput(name, request.binary_output) for name in model.manifest.outputs]
    for output in request.outputs:
        if output.name not in model.manifest.outputs:
            raise BadRequest(f"model {model.name!r} has no output {output.name!r}; it has {model.manifest.outputs}")
    return request.outputs


async def infer_tensors(
    model: ModelVersion, request: InferRequest, *, max_rows: int, deadline: float | None = None
) -> TensorOutcome:
    """Run a parsed inference request on ``model``.

    Args:
        model: the model version.
        request: the parsed request; its one input must be the manifest's input tensor
            (B, C, H, W) of the manifest's dtype, H and W as fixed by the manifest or any size.
        max_rows: the largest batch size B accepted in one request.
        deadline: when the request expires, on the batcher's clock (``model.batcher.deadline()``);
            None: the batcher's ``request_timeout`` from now.

    Returns:
        The requested outputs, each stacked to (B, ...) in row order.

    Raises:
        BadRequest: wrong input name, datatype or shape, unknown output, a classification
            asked of an output that is not (B, N) (400).
        BadRequest: B over the model's whole queue_size (400: it could never be admitted).
        BadRequest: H x W larger than the model's preprocessing ever makes it, or, for a model
            with padding buckets, a row whose real pixels fit none (400).
        Unavailable: the batcher's queue has no room for all B rows now (503, nothing is queued).
        Unavailable, DeadlineExceeded, InferenceFailed: from the batcher, for the first row
            that failed (the request fails whole, as the protocol has no partial results).
    """
    x = _checked_input(model, request, max_rows)
    requested = _requested(model, request)
    for output in requested:  # (before admission: a request that can never succeed is a 400, not a 503 to retry)
        if output.classification and not tasks.serves(model.manifest, classification.TASK):
            raise BadRequest(
                f"output {output.name!r}: the classification extension needs a {classification.TASK.name} model"
            )
        if output.classification:  # refused before the rows run, from the graph's shape where its rank is known
            shape = next((shape for name, _, shape in output_specs(model) if name == output.name), [])
            if shape and len(shape) != 2:  # [] is ONNX Runtime's word for a rank it does not know: checked after
                raise BadRequest(f"output {output.name!r} has shape {shape}; classification needs (B, N)")
    # Admitted whole or not at all, as /v1 requests are; more rows than the queue holds is a 400 as there.
    model.batcher.admit(x.shape[0], "row(s)")
    sizes = _valid_sizes(model, request, x)
    if sizes is None:  # a graph without a mask: each row whole
        if -1 in dims(model.manifest.input.shape)[2:]:
            _checked_extent(model, x.shape[2], x.shape[3], f"input {model.manifest.input.name!r}")
        submits = [
            model.batcher.submit(np.ascontiguousarray(x[i]), deadline=deadline, whole=True) for i in range(x.shape[0])
        ]
    else:  # each row's real pixels, padded again by the batcher to their bucket
        buckets = _row_buckets(model, sizes, x.shape[2], x.shape[3])
        submits = [
            model.batcher.submit(np.ascontiguousarray(x[i, :, :h, :w]), deadline=deadline, bucket=bucket, whole=True)
            for i, ((h, w), bucket) in enumerate(zip(sizes, buckets, strict=True))
        ]
    rows = await asyncio.gather(*submits, return_exceptions=True)
    failures = [r for r in rows if isinstance(r, BaseException)]
    if failures:
        problems = [f for f in failures if isinstance(f, ProblemError)]
        raise (problems or failures)[0]
    results: list[InferenceResult] = rows  # type: ignore[assignment]
    tensors = []
    for output in requested:
        stacked = np.stack([r.outputs[output.name] for r in results])  # (B, ...)
        if output.classification:
            if stacked.ndim != 2:
                raise BadRequest(f"output {output.name!r} has shape {list(stacked.shape)}; classification needs (B, N)")
            stacked = _classify(stacked, output.classification, model.manifest.labels)
        tensors.append(OutputTensor(output.name, stacked, output.binary))
    return TensorOutcome(tensors, max(r.queue_seconds for r in results), max(r.compute_seconds for r in results))
