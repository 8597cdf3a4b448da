"""A lone request through the HTTP API (service/batching/alone.py), on the committed vit-digits graph:
decoded and run in one decode-pool thread when the batcher is idle and the image is cheap, else
batched as before; the same answer either way."""

from __future__ import annotations

import asyncio
import io
import threading

import numpy as np
import pytest
from PIL import Image

from service.batching import alone
from service.pipeline import decoding
from service.pipeline.pool import DecodePool
from service.runtime.sessions import OrtRunner
from tests.conftest import running_app
from tests.service.helpers import sample
from tests.service.pipeline.recorded_runner import CLASSIFY, HANG_GUARD, batcher_of, one_of_each, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def run_threads(monkeypatch) -> list[str]:
    """The name of the thread each ONNX Runtime run is called from."""
    threads: list[str] = []
    original = OrtRunner.run

    def run(runner: OrtRunner, batch: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        threads.append(threading.current_thread().name)
        return original(runner, batch, mask)

    monkeypatch.setattr(OrtRunner, "run", run)
    return threads


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


async def test_a_lone_image_is_run_by_its_decode_thread_and_a_costly_one_by_the_runner(
    digits_test_split, run_threads
) -> None:
    (digit,) = one_of_each(digits_test_split, range(7, 8))
    big = Image.open(io.BytesIO(digit)).convert("RGB").resize((2100, 2100))  # 4.4 MP: past alone.MAX_PIXELS
    large = png(big)
    noisy = png(Image.fromarray(np.random.default_rng(0).integers(0, 256, (640, 640, 3), np.uint8)))
    assert alone.MAX_PIXELS < 2100 * 2100 and len(large) <= alone.MAX_BYTES < len(noisy)
    labels = {"model": "vit-digits", "version": "1"}
    async with running_app(wide_session=True) as client:
        before = (await client.get("/metrics")).text
        run_threads.clear()  # (the warm-up's runs)
        answers = []
        for body in (digit, large, noisy):
            response = await client.post(CLASSIFY, content=body, headers={"content-type": "image/png"})
            assert response.status_code == 200, response.text
            answers.append(response.json())
        metrics = (await client.get("/metrics")).text
    assert run_threads[0].startswith("decode"), run_threads  # one trip: decoded and run in the pool
    assert run_threads[1].startswith("run-") and run_threads[2].startswith("run-"), run_threads  # batched
    assert answers[0]["predictions"][0]["label"] == answers[1]["predictions"][0]["label"] == "7"
    for name, extra in (
        ("patchserve_batches_total", {"reason": "idle"}),
        ("patchserve_compute_duration_seconds_count", {}),
    ):
        grew = sample(metrics, name, **labels, **extra) - sample(before, name, **labels, **extra)
        assert grew == 3, name  # each a batch of one, whichever way it ran


async def test_a_lone_request_answered_504_while_it_decoded_is_never_run(
    digits_test_split, run_threads, monkeypatch
) -> None:
    (digit,) = one_of_each(digits_test_split, range(1))
    held = threading.Event()
    original = decoding._decode_and_preprocess

    def held_decode(*args, **kwargs):
        held.wait(HANG_GUARD)  # a slow decode: it outlives the request's deadline
        return original(*args, **kwargs)

    async with running_app() as client:
        pool = client.app.state.server.decode_pool
        run_threads.clear()
        monkeypatch.setattr(decoding, "_decode_and_preprocess", held_decode)
        response = await client.post(CLASSIFY + "?timeout=0.1", content=digit, headers={"content-type": "image/png"})
        held.set()
        await until(lambda: pool.pending == 0)  # its decode thread has ended, run or not
        assert response.status_code == 504 and run_threads == []  # answered 504: never run
        monkeypatch.setattr(decoding, "_decode_and_preprocess", original)
        after = await client.post(CLASSIFY, content=digit, headers={"content-type": "image/png"})
    assert after.status_code == 200
    assert len(run_threads) == 1 and run_threads[0].startswith("decode")  # the next one ran, in one trip


def test_the_decode_pool_tells_whether_a_job_would_start_at_once() -> None:
    gate = threading.Event()
    with DecodePool(1, thread_name_prefix="decode") as pool:
        assert pool.idle
        busy = pool.submit(gate.wait, HANG_GUARD)
        assert not pool.idle  # a lone request now finds no free thread: it does not claim its runner
        gate.set()
        assert busy.result(HANG_GUARD)
        for _ in range(int(HANG_GUARD / 0.001)):  # the count drops as the thread ends the job
            if pool.idle:
                break
            threading.Event().wait(0.001)
        assert pool.idle


async def test_a_lone_request_does_not_claim_its_runner_while_the_decode_pool_is_busy(digits_test_split) -> None:
    (digit,) = one_of_each(digits_test_split, range(1))
    gate = threading.Event()
    async with running_app(decode_threads=1) as client:
        batcher = batcher_of(client)
        pool = client.app.state.server.decode_pool
        busy = pool.submit(gate.wait, HANG_GUARD)  # another model's large image
        claims: list[object] = []
        claim_alone = batcher.claim_alone

        def recorded():
            claims.append(claim := claim_alone())
            return claim

        batcher.claim_alone = recorded
        waiting = asyncio.ensure_future(client.post(CLASSIFY, content=digit, headers={"content-type": "image/png"}))
        await until(lambda: pool.pending == 2)  # its decode waits behind the busy one
        gate.set()
        assert (await waiting).status_code == 200 and busy.result(HANG_GUARD)
    assert claims == []  # it never asked for one: the pool had no free thread


async def test_a_lone_run_is_never_counted_as_decoding_time_even_when_it_fails(monkeypatch) -> None:
    import types

    from service.batching.batcher import Batcher
    from service.batching.config import BatchingConfig

    now = [0.0]  # one fake perf_counter for the decode thread and the loop: only the model moves it

    def failing_model(x: np.ndarray) -> dict[str, np.ndarray]:
        now[0] += 0.3
        raise RuntimeError("CUDA error: out of memory")

    def decoded_at_once(model, data, max_pixels, limits, budget, held, keep_image, lone, deadline):
        x = np.zeros((3, 2, 2), np.float32)
        return types.SimpleNamespace(pixels=4), ("picture", x), lone(x, None, deadline)

    monkeypatch.setattr(decoding, "_open_and_decode", decoded_at_once)
    monkeypatch.setattr(decoding.time, "perf_counter", lambda: now[0])
    config = BatchingConfig(max_batch_size=2, max_queue_delay=0.01, queue_size=8, request_timeout=5.0)
    batcher = Batcher(failing_model, config, model="lone-timing", version="1")
    await batcher.start()
    try:
        model = types.SimpleNamespace(batcher=batcher, name="lone-timing", version=1)
        with DecodePool(1) as pool:
            outcome, x = await decoding.decode_alone(
                model, decoding.Work(0, b"file"), pool, 10**9, decoding.DecodeLimits(),
                budget=None, deadline=batcher.deadline(), keep_image=False, lone=batcher.claim_alone(),
            )  # fmt: skip
    finally:
        await batcher.stop()
    assert x is None and outcome.error is not None and outcome.error.status == 500
    assert outcome.decode_seconds == 0.0  # the 0.3 s the failed run took are not decoding's
