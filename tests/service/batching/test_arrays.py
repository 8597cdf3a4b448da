"""A batch's arrays: stacking into preallocated buffers, the buffers' reuse and bounds, detaching outputs."""

from __future__ import annotations

import numpy as np
import pytest

from service.batching.arrays import BatchBuffers, BatchOutputMismatch, detach, split_outputs, stack_inputs

pytestmark = pytest.mark.anyio


def item(ident: int, shape: tuple[int, ...] = (3, 4, 5)) -> np.ndarray:
    return np.full(shape, ident, dtype=np.float32)


def test_stacking_into_a_buffer_writes_the_rows_in_place_and_returns_that_memory() -> None:
    buffers = BatchBuffers(max_batch_size=8)
    out = buffers.get((3, 4, 5), np.float32, rows=3)
    batch = stack_inputs([item(i) for i in range(3)], out=out)
    assert batch is out and batch.shape == (3, 3, 4, 5) and batch.flags.c_contiguous
    assert [float(batch[i].mean()) for i in range(3)] == [0.0, 1.0, 2.0]
    np.testing.assert_array_equal(batch, np.stack([item(i) for i in range(3)]))


def test_the_same_shape_gets_the_same_memory_every_time() -> None:
    buffers = BatchBuffers(max_batch_size=4)
    first = buffers.get((3, 4, 5), np.float32, rows=4)
    second = buffers.get((3, 4, 5), np.float32, rows=2)
    assert np.shares_memory(first, second) and second.shape == (2, 3, 4, 5)
    assert first.__array_interface__["data"][0] == second.__array_interface__["data"][0]
    other_dtype = buffers.get((3, 4, 5), np.float16, rows=2)
    assert not np.shares_memory(first, other_dtype) and other_dtype.dtype == np.float16
    assert len(buffers) == 2


def test_only_the_most_recent_shapes_are_kept() -> None:
    buffers = BatchBuffers(max_batch_size=2, shapes_kept=2)
    a = buffers.get((1, 8, 8), np.float32, rows=1)
    buffers.get((1, 9, 9), np.float32, rows=1)
    buffers.get((1, 8, 8), np.float32, rows=1)  # used again: now the most recent
    buffers.get((1, 10, 10), np.float32, rows=1)  # evicts (1, 9, 9), the least recently used
    assert len(buffers) == 2
    assert np.shares_memory(a, buffers.get((1, 8, 8), np.float32, rows=1))


@pytest.mark.parametrize("rows", [0, 5])
def test_a_batch_that_does_not_fit_is_refused(rows: int) -> None:
    with pytest.raises(ValueError, match=f"a batch of {rows} does not fit buffers of 4 rows"):
        BatchBuffers(max_batch_size=4).get((3, 4, 5), np.float32, rows=rows)


def test_detach_copies_only_outputs_that_alias_the_batch() -> None:
    batch = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    own = np.ones((2, 10), dtype=np.float32)
    view = batch[:, 0, 0, :]  # (2, 2), a view of the input
    detached = detach({"logits": own, "echo": view}, batch)
    assert detached["logits"] is own
    assert detached["echo"] is not view and not np.shares_memory(detached["echo"], batch)
    batch[:] = -1  # the next batch overwrites the buffer
    assert detached["echo"].tolist() == [[0.0, 1.0], [12.0, 13.0]]


def test_stack_then_split_gives_each_input_its_own_row() -> None:
    inputs = [item(i, (3, 4, 5)) for i in range(3)]
    batch = stack_inputs(inputs)
    assert batch.shape == (3, 3, 4, 5) and batch.dtype == np.float32
    rows = split_outputs({"logits": np.arange(6).reshape(3, 2), "boxes": np.zeros((3, 4, 4))}, 3)
    assert [row["logits"].tolist() for row in rows] == [[0, 1], [2, 3], [4, 5]]
    assert rows[2]["boxes"].shape == (4, 4)
    with pytest.raises(BatchOutputMismatch, match="'logits' has 2 rows for a batch of 3"):
        split_outputs({"logits": np.zeros((2, 10))}, 3)
    with pytest.raises(BatchOutputMismatch, match="'score' has None rows"):
        split_outputs({"score": np.float32(1.0)}, 1)
    with pytest.raises(BatchOutputMismatch, match="no outputs"):
        split_outputs({}, 1)
