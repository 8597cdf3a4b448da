"""Padding buckets (issue 18): inputs of several sizes share a batch padded to their bucket, with a pixel mask."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.batching.arrays import BatchBuffers, pad_inputs
from tests.service.batching.fakes import FakeModel, ManualClock, item, result, running, settle

pytestmark = pytest.mark.anyio


class MaskedModel(FakeModel):
    """A fake detector taking (batch, mask): records both; returns each row's id, pixel sum and mask sum."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, x: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:  # type: ignore[override]
        assert mask is not None, "a bucketed batch comes with its mask"
        self.seen.append((x.copy(), mask.copy()))
        self.batches.append([int(v) for v in x[:, 0, 0, 0]])
        return {"id": x[:, :1, 0, 0].copy(), "total": x.reshape(len(x), -1).sum(axis=1), "valid": mask.sum(axis=(1, 2))}


async def test_inputs_of_several_sizes_in_one_bucket_share_a_batch_padded_with_zeros_and_masked() -> None:
    model, clock = MaskedModel(), ManualClock()
    sizes = [(6, 8), (8, 5), (3, 3)]  # (h, w), all inside the (8, 8) bucket
    async with running(model, clock, max_batch_size=4, max_queue_delay=0.5) as batcher:
        model.gate.clear()  # the first request runs alone and holds the runner; the others queue together
        first = asyncio.ensure_future(batcher.submit(item(9, (1, 4, 4)), bucket=(8, 8)))
        await settle()
        queued = [batcher.submit(item(i + 1, (1, h, w)), bucket=(8, 8)) for i, (h, w) in enumerate(sizes)]
        tasks = [asyncio.ensure_future(q) for q in queued]
        await settle()
        model.gate.set()
        clock.advance(1.0)
        answers = await result(asyncio.gather(first, *tasks))
    assert model.batches == [[9], [1, 2, 3]]
    x, mask = model.seen[1]
    assert x.shape == (3, 1, 8, 8) and mask.shape == (3, 8, 8) and mask.dtype == np.int64
    for row, (ident, (h, w)) in enumerate(zip((1, 2, 3), sizes, strict=True)):
        assert np.all(x[row, :, :h, :w] == ident) and x[row].sum() == ident * h * w  # zeros around it
        assert np.all(mask[row, :h, :w] == 1) and mask[row].sum() == h * w
    assert [int(a.outputs["valid"]) for a in answers] == [16, 48, 40, 9]
    assert [a.batch_size for a in answers] == [1, 3, 3, 3]


async def test_inputs_of_different_buckets_never_share_a_batch() -> None:
    model, clock = MaskedModel(), ManualClock()
    async with running(model, clock, max_batch_size=4, max_queue_delay=0.5) as batcher:
        model.gate.clear()
        first = asyncio.ensure_future(batcher.submit(item(9, (1, 2, 2)), bucket=(4, 4)))
        await settle()
        tasks = [
            asyncio.ensure_future(batcher.submit(item(i, (1, 3, 3)), bucket=bucket))
            for i, bucket in ((1, (4, 4)), (2, (8, 4)), (3, (4, 4)))
        ]
        await settle()
        model.gate.set()
        clock.advance(1.0)
        await result(asyncio.gather(first, *tasks))
    assert sorted(model.batches) == [[1, 3], [2], [9]]
    assert {tuple(x.shape) for x, _ in model.seen} == {(1, 1, 4, 4), (2, 1, 4, 4), (1, 1, 8, 4)}


def test_a_reused_buffer_is_cleared_around_every_input_and_an_oversize_input_is_refused() -> None:
    buffers = BatchBuffers(max_batch_size=2)
    out, mask = buffers.get((1, 4, 4), np.dtype(np.float32), 2), buffers.get((4, 4), np.dtype(np.int64), 2)
    out[:] = 7.0
    mask[:] = 5  # what a previous batch left
    pad_inputs([np.ones((1, 2, 3), np.float32), np.ones((1, 4, 1), np.float32)], out, mask)
    assert out.sum() == 6 + 4 and mask.sum() == 6 + 4 and set(np.unique(mask)) == {0, 1}
    with pytest.raises(ValueError, match="does not fit"):
        pad_inputs([np.ones((1, 5, 1), np.float32)], out[:1], mask[:1])
