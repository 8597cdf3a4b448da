"""ONNX Runtime sessions: thread options, IO binding on the CPU provider, CUDA options, instances per model."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest

from service.runtime.sessions import CPU, CUDA, CudaOptions, OrtRunner, providers_with_options
from tests.conftest import MODEL_REPOSITORY, png_bytes, running_app

GRAPH = MODEL_REPOSITORY / "vit-digits" / "1" / "model.onnx"


def digits_batch(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 1, 8, 8)).astype(np.float32)  # (B, 1, 8, 8)


def test_io_binding_on_the_cpu_gives_the_same_outputs_as_a_plain_run() -> None:
    plain = OrtRunner(GRAPH, device="cpu")
    bound = OrtRunner(GRAPH, device="cpu", io_binding=True)
    for n in (1, 7):
        x = digits_batch(n)
        expected, got = plain.run(x), bound.run(x)
        assert list(got) == ["logits", "embedding"] and got["logits"].shape == (n, 10)
        assert got["logits"].dtype == got["embedding"].dtype == np.float32 and got["embedding"].shape == (n, 32)
        for name in got:
            np.testing.assert_array_equal(got[name], expected[name])


@pytest.mark.parametrize(("spinning", "expected"), [(True, "1"), (False, "0")])
def test_thread_options_reach_the_session(spinning: bool, expected: str) -> None:
    runner = OrtRunner(GRAPH, device="cpu", intra_op_threads=1, inter_op_threads=1, intra_op_spinning=spinning)
    options = runner.session.get_session_options()
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == expected
    assert options.get_session_config_entry("session.force_spinning_stop") == expected  # spin only while a run runs
    assert runner.providers.in_use == [CPU] and runner.device_type == "cpu"


def test_cuda_options_go_with_the_cuda_provider_only() -> None:
    cuda = CudaOptions(device_id=1, cudnn_conv_algo_search="HEURISTIC", gpu_mem_limit=2**30)
    assert providers_with_options([CUDA, CPU], cuda) == [
        (
            CUDA,
            {
                "device_id": "1",
                "cudnn_conv_algo_search": "HEURISTIC",
                "arena_extend_strategy": "kSameAsRequested",
                "do_copy_in_default_stream": "1",
                "gpu_mem_limit": "1073741824",
            },
        ),
        CPU,
    ]
    assert "gpu_mem_limit" not in CudaOptions().provider_options()  # 0: no limit, ORT's default
    assert providers_with_options([CPU], cuda) == [CPU]


class CountingSession:
    """An ONNX Runtime session, wrapped: counts the IO-bound runs made on it; with ``hold``, its
    first run waits (at most 10 s) until that event is set. Everything else goes to the session."""

    def __init__(self, session, hold: threading.Event | None = None) -> None:
        self._session, self.hold = session, hold
        self.runs = 0
        self.ran = threading.Event()

    def run_with_iobinding(self, binding, *args) -> None:
        if self.hold is not None and self.runs == 0:
            self.hold.wait(10.0)
        self._session.run_with_iobinding(binding, *args)
        self.runs += 1
        self.ran.set()

    def __getattr__(self, name: str):
        return getattr(self._session, name)


@pytest.mark.anyio
async def test_several_instances_serve_one_model_and_are_reported(digits_test_split) -> None:
    async with running_app(instances=2, io_binding=True, intra_op_threads=1, max_batch_size=4) as client:
        model = client.app.state.server.repository.get("vit-digits")
        assert len(model.instances) == 2 and model.instances[0] is not model.instances[1]
        assert model.batcher.instances == 2
        # Count the runs of each instance's own session (warm-up is over); the first holds its first
        # run until the second has run, so the second is used however fast the first answers.
        second = CountingSession(model.instances[1].session)
        first = CountingSession(model.instances[0].session, hold=second.ran)
        model.instances[0].session, model.instances[1].session = first, second
        described = (await client.get("/v1/models/vit-digits")).json()
        assert described["versions"][0]["instances"] == 2
        images, labels = digits_test_split.images[:16], digits_test_split.labels[:16]
        responses = [
            client.post("/v1/models/vit-digits/classify", files={"image": ("d.png", png_bytes(p), "image/png")})
            for p in images
        ]
        answers = [r.json() for r in await asyncio.gather(*responses)]
    assert first.runs >= 1 and second.runs >= 1, (first.runs, second.runs)  # each session ran batches
    assert first.runs + second.runs >= 16 // 4  # 16 images, at most 4 a batch
    from export import evaluate
    from service.runtime.manifest import load_manifest

    in_process = evaluate.predict(GRAPH, load_manifest(GRAPH.with_name("model.json")).preprocessing, images)
    assert [a["predictions"][0]["class_id"] for a in answers] == in_process.tolist()
    assert np.mean(in_process == labels) >= 0.9


@pytest.mark.anyio
async def test_a_lone_request_runs_on_the_wide_session_with_every_core(
    digits_test_split,
) -> None:
    settings = {"instances": 2, "io_binding": True, "intra_op_threads": 1, "max_batch_size": 4, "wide_session": True}
    async with running_app(**settings) as client:
        model = client.app.state.server.repository.get("vit-digits")
        share = model.threads.share
        assert model.wide is not None and model.wide not in model.instances and model.batcher.instances == 2
        assert model.wide.session.get_session_options().intra_op_num_threads == share
        wide, first = CountingSession(model.wide.session), CountingSession(model.instances[0].session)
        second = CountingSession(model.instances[1].session)
        model.wide.session, model.instances[0].session, model.instances[1].session = wide, first, second
        images = digits_test_split.images[:9]

        def post(image: np.ndarray):
            return client.post(
                "/v1/models/vit-digits/classify", files={"image": ("d.png", png_bytes(image), "image/png")}
            )

        alone = (await post(images[0])).json()
        assert (wide.runs, first.runs, second.runs) == (1, 0, 0)  # nothing else waited, every instance idle
        burst = [r.json() for r in await asyncio.gather(*(post(image) for image in images[1:]))]
        threads = (await client.get("/v1/models/vit-digits")).json()["versions"][0]["threads"]
    # Which runner each of the burst's batches took depends on when each image was decoded; the batcher's
    # own tests (test_batcher_instances.py) pin that down with a manual clock. Here: every answer is right.
    assert threads["wide_session_threads"] == share and threads["wide_session_batches"] == wide.runs
    assert "wide session for lone requests (set)" in threads["reason"]
    from export import evaluate
    from service.runtime.manifest import load_manifest

    in_process = evaluate.predict(GRAPH, load_manifest(GRAPH.with_name("model.json")).preprocessing, images)
    assert [a["predictions"][0]["class_id"] for a in [alone, *burst]] == in_process.tolist()


def test_device_cuda_without_the_cuda_provider_is_reported_not_assumed(monkeypatch) -> None:
    from service.runtime import sessions as runtime

    preloaded = []
    monkeypatch.setattr(runtime.ort, "preload_dlls", lambda: preloaded.append(True), raising=False)
    runtime.preload_cuda_libraries.cache_clear()
    cuda = CudaOptions(cudnn_conv_algo_search="HEURISTIC", gpu_mem_limit=2**30)
    runner = OrtRunner(GRAPH, device="cuda", io_binding=True, cuda=cuda)  # the CPU package: CUDA cannot load
    assert preloaded == [True]  # the nvidia-* libraries are loaded before the session asks for CUDA
    assert runner.providers.requested == [CUDA, CPU] and runner.providers.in_use == [CPU]
    assert not runner.providers.ok and "device=cuda" in runner.providers.reason
    assert "onnxruntime-gpu installed?" in runner.providers.reason
    assert runner.device_type == "cpu"  # the IO binding then binds on the CPU, and still runs
    x = digits_batch(5)
    np.testing.assert_array_equal(runner.run(x)["logits"], OrtRunner(GRAPH, device="cpu").run(x)["logits"])
    OrtRunner(GRAPH, device="cpu")
    assert preloaded == [True]  # once per process, and never for the CPU alone


@pytest.mark.anyio
async def test_device_cuda_keeps_readyz_at_503_saying_why_when_only_the_cpu_provider_loads() -> None:
    from service.http.app import create_app
    from tests.conftest import make_settings

    app = create_app(make_settings(device="cuda"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(6000):  # until the models are loaded (not ready either way); a bound, never a figure
                if getattr(app.state.server, "repository", None) is not None:
                    break
                await asyncio.sleep(0.01)
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and ready.headers["content-type"] == "application/problem+json"
            assert "device=cuda but the session got ['CPUExecutionProvider']" in ready.json()["detail"]
            assert (await client.get("/healthz")).status_code == 200  # alive, only not ready
            model = app.state.server.repository.get("vit-digits")
            assert model.runner.providers.primary == CPU and not model.warmed_up
