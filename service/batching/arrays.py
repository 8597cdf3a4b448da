"""A batch's arrays: inputs stacked into preallocated buffers, outputs checked and split per input.

The batcher stacks each batch straight into a preallocated buffer instead of a new array.
Each model instance (runner) owns its buffers, one per input shape it has seen (the few most
recent shapes only, so a detector fed many image sizes does not hoard memory). A runner runs
one batch at a time, so its buffer is free again when its run returns; outputs that might
alias the buffer are copied before it is reused (see :func:`detach`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

SHAPES_KEPT = 4  # per runner: a classifier sees one shape; a detector's recent few are kept


class BatchBuffers:
    """One runner's preallocated (max_batch_size, C, H, W) arrays, by input shape and dtype.

    Args:
        max_batch_size: rows of every buffer.
        shapes_kept: most distinct shapes kept; the least recently used goes first.
    """

    def __init__(self, max_batch_size: int, shapes_kept: int = SHAPES_KEPT) -> None:
        self.max_batch_size = max_batch_size
        self.shapes_kept = shapes_kept
        self._buffers: OrderedDict[tuple[tuple[int, ...], str], np.ndarray] = OrderedDict()

    def get(self, shape: tuple[int, ...], dtype: np.dtype, rows: int) -> np.ndarray:
        """A C-contiguous view (rows, *shape) of this runner's buffer for ``shape`` and ``dtype``.

        The same memory comes back on every call for that shape: write into it, run, and let
        go before the next call.

        Raises:
            ValueError: ``rows`` is not between 1 and ``max_batch_size``.
        """
        if not 1 <= rows <= self.max_batch_size:
            raise ValueError(f"a batch of {rows} does not fit buffers of {self.max_batch_size} rows")
        key = (tuple(shape), np.dtype(dtype).str)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = np.empty((self.max_batch_size, *shape), dtype=dtype)
            self._buffers[key] = buffer
            while len(self._buffers) > self.shapes_kept:
                self._buffers.popitem(last=False)
        else:
            self._buffers.move_to_end(key)
        return buffer[:rows]  # a leading-axis slice of a C-contiguous array is C-contiguous

    def __len__(self) -> int:
        return len(self._buffers)


def detach(outputs: Mapping[str, np.ndarray], batch: np.ndarray) -> dict[str, np.ndarray]:
    """``outputs`` with any array that may share memory with ``batch`` copied.

    ONNX Runtime allocates its outputs, so nothing is copied in practice; a model function
    that returned a view of its input would otherwise see its rows overwritten by the next
    batch stacked into the same buffer.
    """
    return {
        name: value.copy() if isinstance(value, np.ndarray) and np.may_share_memory(value, batch) else value
        for name, value in outputs.items()
    }


class BatchOutputMismatch(Exception):
    """The model returned no outputs, or an output without one row per input."""


def stack_inputs(inputs: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """Build one batch: B arrays (C, H, W) of one shape and dtype -> one array (B, C, H, W).

    The one place a batch's input array is made.

    Args:
        inputs: the B inputs.
        out: a C-contiguous (B, C, H, W) array of their dtype to write into (a preallocated
            batch buffer); None: a new array.

    Returns:
        ``out`` filled, or the new array.
    """
    return np.stack(inputs, out=out)


def pad_inputs(inputs: Sequence[np.ndarray], out: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Build one padded batch: B arrays (C, h_i, w_i) -> (B, C, H, W) and its pixel mask (B, H, W).

    Each input sits at the top-left of its row; the rest of the row is 0 (in input space, as the
    Hugging Face ``DetrImageProcessor.pad`` pads) and 0 in the mask, which is 1 on the input's
    pixels (Carion et al. 2020, Sec. 4).

    Args:
        inputs: the B inputs, each at most (C, H, W).
        out: a (B, C, H, W) array of their dtype to write into (a batch buffer), every element written.
        mask: an int64 (B, H, W) array to write into, every element written.

    Returns:
        ``out`` and ``mask``, filled.

    Raises:
        ValueError: an input larger than (H, W) or with other channels.
    """
    channels, height, width = out.shape[1:]
    for i, x in enumerate(inputs):
        c, h, w = x.shape
        if c != channels or h > height or w > width:
            raise ValueError(f"an input of shape {x.shape} does not fit a padded batch of {out.shape[1:]}")
        out[i, :, :h, :w] = x
        out[i, :, h:, :] = 0
        out[i, :, :h, w:] = 0
        mask[i] = 0
        mask[i, :h, :w] = 1
    return out, mask


def run_arguments(
    buffers: BatchBuffers, inputs: Sequence[np.ndarray], bucket: tuple[int, int] | None
) -> tuple[np.ndarray, ...]:
    """A runner's arguments for one batch, built in its buffers: ``(batch,)``, or ``(batch, mask)`` padded.

    Args:
        buffers: the runner's :class:`BatchBuffers` (its own while the batch is built and run).
        inputs: the B (C, H, W) inputs, of one shape and dtype unless padded to ``bucket``.
        bucket: (H, W) to pad them to, with their int64 (B, H, W) pixel mask (:func:`pad_inputs`);
            None: stacked as they are (:func:`stack_inputs`).

    Returns:
        The arguments to call the runner with; the first is the batch, to :func:`detach` the outputs from.
    """
    first = inputs[0]
    if bucket is None:
        return (stack_inputs(inputs, out=buffers.get(first.shape, first.dtype, len(inputs))),)
    batch = buffers.get((first.shape[0], *bucket), first.dtype, len(inputs))
    return pad_inputs(inputs, batch, buffers.get(bucket, np.dtype(np.int64), len(inputs)))


def blank_arguments(shape: tuple[int, int, int], batch_size: int, masked: bool) -> tuple[np.ndarray, ...]:
    """A runner's arguments for a batch of zeros (warm-up, timing): ``(batch,)``, or ``(batch, mask)``.

    Args:
        shape: one float32 input (C, H, W): the model's, or one of its padding buckets'.
        batch_size: B.
        masked: the graph takes an int64 (B, H, W) pixel mask (inputs padded to buckets); all ones.
    """
    c, h, w = shape
    batch = np.zeros((batch_size, c, h, w), dtype=np.float32)
    return (batch, np.ones((batch_size, h, w), dtype=np.int64)) if masked else (batch,)


def run_rows(
    run: Callable[..., Mapping[str, np.ndarray]],
    buffers: BatchBuffers,
    inputs: Sequence[np.ndarray],
    bucket: tuple[int, int] | None,
) -> list[dict[str, np.ndarray]]:
    """One batch, in the runner's thread: built in ``buffers`` (:func:`run_arguments`), run, its outputs
    detached from the buffer (:func:`detach`) and split into one row per input (:func:`split_outputs`).

    Raises:
        BatchOutputMismatch: as :func:`split_outputs`; and whatever ``run`` or building the batch raises.
    """
    args = run_arguments(buffers, inputs, bucket)
    return split_outputs(detach(run(*args), args[0]), len(inputs))


def split_outputs(outputs: Mapping[str, np.ndarray], batch_size: int) -> list[dict[str, np.ndarray]]:
    """Check that every output has one row per input, then split them into per-input rows.

    Args:
        outputs: each output by name, batch axis first (B, ...).
        batch_size: B, the number of inputs that were run.

    Returns:
        ``batch_size`` dicts, input i's row of every output (views, batch axis removed).

    Raises:
        BatchOutputMismatch: no outputs, or an output whose first axis is not ``batch_size``.
    """
    if not outputs:
        raise BatchOutputMismatch("the model returned no outputs")
    for name, value in outputs.items():
        rows = value.shape[0] if getattr(value, "ndim", 0) >= 1 else None
        if rows != batch_size:
            raise BatchOutputMismatch(f"output {name!r} has {rows} rows for a batch of {batch_size} inputs")
    return [{name: value[i] for name, value in outputs.items()} for i in range(batch_size)]
