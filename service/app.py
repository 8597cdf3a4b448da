"""The app factory: ``create_app(settings)`` builds one worker's FastAPI application.

Start-up validates every manifest before the server accepts a connection (a bad one stops
start-up, naming the file and field), then loads the ONNX Runtime sessions and warms them up
in the background while ``/healthz`` answers and ``/readyz`` says 503.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.admission import EXEMPT_PATHS, AdmissionMiddleware
from service.api.routes import health, inference, metrics, models, v2
from service.auth import add_security_middleware
from service.batching import BatchingConfig
from service.errors import RepositoryError, install_handlers
from service.logs import AccessLogMiddleware
from service.manifest import ManifestError, load_manifest
from service.metrics import MODEL_INFO
from service.middleware import RequestIdMiddleware
from service.repository import discover, load_repository
from service.runtime import CudaOptions
from service.settings import Settings, load_settings
from service.state import ServerState

log = logging.getLogger(__name__)


def validate_repository(settings: Settings) -> None:
    """Check the repository layout and every manifest, without loading any graph.

    Raises:
        RepositoryError: the first problem found, naming the file and field.
    """
    for _, _, folder in discover(settings.model_repository):
        try:
            load_manifest(folder / "model.json")
        except ManifestError as exc:
            raise RepositoryError(str(exc)) from None


def _load_and_warm_up(state: ServerState) -> None:
    """Blocking: create every session and run each once per batch size. Sets ``state``."""
    settings = state.settings
    repository = load_repository(
        settings.model_repository,
        device=settings.device,
        batching=BatchingConfig(
            settings.max_batch_size, settings.max_queue_delay, settings.queue_size, settings.request_timeout
        ),
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        intra_op_spinning=settings.intra_op_spinning,
        io_binding=settings.io_binding,
        cuda=CudaOptions(settings.cuda_device_id, settings.cudnn_conv_algo_search, settings.cuda_mem_limit),
        instances=settings.instances,
    )
    for model in repository.all():
        if model.runner.providers.ok:
            model.warm_up()
    state.repository = repository


async def _start_models(state: ServerState) -> None:
    try:
        await asyncio.get_running_loop().run_in_executor(None, _load_and_warm_up, state)
    except Exception as exc:  # a graph that will not load: stay alive, not ready, and say why
        log.exception("loading the models failed")
        state.startup_error = f"loading the models failed: {exc}"
        return
    for model in state.repository.all():
        await model.batcher.start()
        MODEL_INFO.labels(model.name, str(model.version), model.manifest.task, model.runner.providers.primary).set(1)
    log.info("ready: %s", ", ".join(f"{m.name}/{m.version}" for m in state.repository.all()))


def create_app(settings: Settings) -> FastAPI:
    """Build the application for ``settings``.

    Raises:
        RepositoryError: the model repository or a manifest is invalid.
    """
    validate_repository(settings)
    decode_threads = settings.decode_threads or os.cpu_count() or 1
    state = ServerState(
        settings,
        ThreadPoolExecutor(decode_threads, thread_name_prefix="decode"),
        decode_parallelism=max(1, decode_threads // 2),  # one request never holds the whole pool
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(_start_models(state))
        yield
        state.draining = True
        await loader
        if state.repository is not None:
            for model in state.repository.all():
                await model.batcher.stop()
        state.decode_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="patchserve",
        version="0.1.0",
        description="Vision transformers (ViT classifiers, DETR detectors) on ONNX Runtime, with dynamic batching.",
        lifespan=lifespan,
        redirect_slashes=False,  # a POST to .../classify/ is a 404 problem, not a 307 curl will not follow
    )
    app.state.server = state
    install_handlers(app)
    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(inference.build_router())  # one route per registered task
    app.include_router(metrics.router)
    app.include_router(v2.router)
    app.add_middleware(
        AdmissionMiddleware,
        max_in_flight=settings.max_in_flight,
        body_timeout=settings.body_timeout,
        exempt=EXEMPT_PATHS | v2.PROBE_PATHS,  # KServe probes /v2/health/*: never refused either
    )
    add_security_middleware(app, settings)  # outside admission: a request without a key takes no slot
    app.add_middleware(AccessLogMiddleware)
    app.add_middleware(RequestIdMiddleware)  # outermost: every line and problem carries the request id
    return app


def build_app() -> FastAPI:
    """Factory for ``uvicorn --factory``: settings from the environment."""
    return create_app(load_settings())
