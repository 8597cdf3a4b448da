"""The app factory: ``create_app(settings)`` builds one worker's FastAPI application.

Start-up validates every manifest before the server accepts a connection (a bad one stops
start-up, naming the file and field), then loads the ONNX Runtime sessions and warms them up
in the background while ``/healthz`` answers and ``/readyz`` says 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from starlette.types import Scope

from service.batching.config import BatchingConfig
from service.core import lifecycle
from service.core.errors import RepositoryError
from service.core.logs import DECODE_THREADS
from service.core.memory import IdleTrim, malloc_trim
from service.core.settings import Settings, load_settings
from service.core.tracing import Tracer, from_environment, install
from service.core.version import VERSION
from service.http import docs, openapi
from service.http.direct import DirectInference
from service.http.methods import HeadAsGet
from service.http.middleware.access_log import AccessLogMiddleware
from service.http.middleware.admission import EXEMPT_PATHS, AdmissionMiddleware
from service.http.middleware.auth import add_security_middleware
from service.http.middleware.request_id import RequestIdMiddleware
from service.http.middleware.tracing import TracingMiddleware
from service.http.problems import install_handlers
from service.http.routes import health, inference, metrics, models, playground, repository, v2
from service.http.state import ServerState
from service.imaging import libtiff
from service.imaging.pixel_budget import PixelBudget
from service.imaging.prescan_limits import PrescanLimits
from service.pipeline.inference import DecodeLimits
from service.pipeline.pool import DecodePool
from service.runtime.control_signal import FILE_NAME, ControlSignal, follow
from service.runtime.cpus import ThreadPlan, plan_threads, usable_cpus
from service.runtime.loading import Loader
from service.runtime.manifest import ManifestError, load_manifest
from service.runtime.model_control import ModelControl
from service.runtime.repository import ModelRepository, ModelVersion, discover
from service.runtime.repository_folder import fingerprint
from service.runtime.repository_watch import poll_forever
from service.runtime.sessions import CUDA, CudaOptions, requested_providers
from service.runtime.tuning import TuneCache, Tuner, default_cache_dir
from service.runtime.version_policy import ConfigError, apply_policies, read_config
from service.runtime.version_swaps import VersionSwaps
from service.runtime.worker_readiness import WorkerReadiness

log = logging.getLogger(__name__)

PROBES = EXEMPT_PATHS | v2.PROBE_PATHS  # liveness, readiness, metrics, and KServe's /v2/health/*


def admission_exempt(scope: Scope) -> bool:
    """Whether admission lets a request through as it is (never refused, no body timeout).

    :data:`PROBES` by any method, and a GET or HEAD of a model's readiness (``/v2/models/{name}/ready``,
    ``.../versions/{v}/ready``: :data:`~service.http.routes.v2.MODEL_READY` matched whole), which
    KServe probes too: a busy worker is not an unready model.
    """
    path = scope["path"]
    return path in PROBES or (scope.get("method") in ("GET", "HEAD") and v2.MODEL_READY.fullmatch(path) is not None)


def startup_versions(settings: Settings) -> list[tuple[str, int, Path]]:
    """(name, version, folder) of each version start-up serves: each model's version policy
    (Triton's) applied to its version folders.

    Raises:
        RepositoryError: the repository's layout is invalid, or a model's config.json is.
    """
    folders: dict[str, dict[int, Path]] = {}
    for name, version, folder in discover(settings.model_repository):
        folders.setdefault(name, {})[version] = folder
    try:
        return apply_policies(folders, lambda name: read_config(settings.model_repository / name).version_policy)
    except ConfigError as exc:
        raise RepositoryError(str(exc)) from None


def validate_repository(settings: Settings) -> None:
    """Check the repository layout, every model's config.json and the manifest of every version it
    serves, without loading any graph. A version no policy selects is not checked (as Triton
    does not load it); the poller and the load API check it if it is ever selected.

    Raises:
        RepositoryError: the first problem found, naming the file and field.
    """
    for _, _, folder in startup_versions(settings):
        try:
            load_manifest(folder / "model.json")
        except ManifestError as exc:
            raise RepositoryError(str(exc)) from None


def thread_plan(settings: Settings) -> ThreadPlan:
    """The threads each model version gets, from the usable cores and the settings that force values."""
    return plan_threads(
        usable_cpus(),
        workers=settings.workers,
        models=len(startup_versions(settings)),  # versions on disk that no policy selects take no share
        device_type="cuda" if requested_providers(settings.device)[0] == CUDA else "cpu",
        instances=settings.instances,
        intra_op_threads=settings.intra_op_threads,
        spinning=settings.intra_op_spinning,
        decode_threads=settings.decode_threads,
        wide=settings.wide_session,
    )


def tuner(settings: Settings) -> Tuner | None:
    """The auto-tuner the settings ask for (None: off)."""
    if not settings.auto_tune:
        return None
    import onnxruntime

    return Tuner(
        TuneCache(settings.tune_cache or default_cache_dir()),
        point_seconds=settings.tune_point_seconds,
        budget_seconds=settings.tune_seconds,
        rounds=settings.tune_rounds,
        max_batch_size=settings.tune_max_batch_size,
        max_instances=settings.tune_max_instances,
        ort_version=onnxruntime.__version__,
        busy_cores=settings.tune_busy_cores,
    )


def loader(settings: Settings, threads: ThreadPlan | None, tuning: Tuner | None) -> Loader:
    """What every model version is loaded with, from ``settings``."""
    return Loader(
        device=settings.device,
        batching=BatchingConfig(
            settings.max_batch_size, settings.max_queue_delay, settings.queue_size, settings.request_timeout
        ),
        inter_op_threads=settings.inter_op_threads,
        io_binding=settings.io_binding,
        cuda=CudaOptions(settings.cuda_device_id, settings.cudnn_conv_algo_search, settings.cuda_mem_limit),
        threads=threads,
        tuner=tuning,
        batch_size_fixed="max_batch_size" in settings.model_fields_set,
        scaled_decode=settings.scaled_decode,
    )


def _load_and_warm_up(control: ModelControl) -> list[ModelVersion]:
    """Blocking: tune, create every session the version policies select and run each once per batch size.

    A version whose graph fails to load is left out as the poller leaves one out (``version_swaps``'s
    "Failure"): listed ``UNAVAILABLE`` with its reason, counted, and the policy selects among the
    others (``latest: 1`` with a broken version 2 serves version 1), so a worker started beside
    broken files serves what a running one does. Once nothing more is selected, what loaded serves.

    Raises:
        StartupStopped: a shutdown was requested meanwhile (checked before each version and tuning point).
        RepositoryError: no version at all could be loaded (each failure's reason in the message).
    """
    tuning = control.swaps.loader.tuner
    loaded: dict[tuple[str, int], ModelVersion] = {}
    with tuning.exclusive() if tuning is not None else contextlib.nullcontext():  # one worker measures at a time
        todo = control.startup_versions()
        while todo:
            for name, version, folder in todo:
                lifecycle.stop_if_shutting_down()
                try:
                    loaded[(name, version)] = control.swaps.loader.load(name, version, folder)
                except lifecycle.StartupStopped:
                    raise
                except Exception as exc:  # its failure recorded, the next pass's policies leave it out
                    control.swaps.record_failure(name, version, fingerprint(folder), exc, at_startup=True)
            if all((n, v) in loaded for n, v, _ in todo):
                break  # the repository is read again only after a failure: what the policies select instead
            todo = [(n, v, f) for n, v, f in control.startup_versions() if (n, v) not in loaded]
    models = list(loaded.values())
    for model in models:
        lifecycle.stop_if_shutting_down()
        if model.runner.providers.ok:
            model.warm_up()
    if not models:
        failures = [f"{n}/{v}: {s.reason}" for n, states in control.states.items() for v, s in states.items()]
        raise RepositoryError("no model version could be loaded: " + "; ".join(failures))
    return models


async def _start_models(state: ServerState, control: ModelControl) -> None:
    try:
        models = await asyncio.get_running_loop().run_in_executor(None, _load_and_warm_up, control)
    except lifecycle.StartupStopped as exc:  # SIGTERM during start-up: the drain ends without the models
        log.info("%s", exc)
        state.startup_error = str(exc)
        return
    except Exception as exc:  # a graph that will not load: stay alive, not ready, and say why
        log.exception("loading the models failed")
        state.startup_error = f"loading the models failed: {exc}"
        return
    for model in models:
        await model.batcher.start()
        control.adopt(model)
    state.repository = control.repository
    if state.workers is not None:
        state.workers.set_ready()
    log.info("ready: %s", ", ".join(f"{m.name}/{m.version}" for m in state.repository.all()))


def worker_readiness(settings: Settings) -> WorkerReadiness | None:
    """With several workers, their shared readiness (None: one worker, or no shared folder)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if settings.workers == 1 or not folder:
        return None
    return WorkerReadiness(Path(folder), settings.workers)


def control_signal(settings: Settings) -> ControlSignal | None:
    """With several workers, the file they share the load API's changes through (None: one worker)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if settings.workers == 1 or not folder:
        return None
    return ControlSignal(Path(folder) / FILE_NAME)


def decode_limits(settings: Settings) -> DecodeLimits:
    """The pre-scan's and one request's decoding limits, from ``settings``.

    Each field of :class:`PrescanLimits` is the setting of its name (``PATCHSERVE_MAX_...``), but
    ``max_metadata_bytes``, which is ``max_image_metadata_bytes``.
    """
    renamed = {"max_metadata_bytes": "max_image_metadata_bytes"}
    prescan = {f.name: getattr(settings, renamed.get(f.name, f.name)) for f in dataclasses.fields(PrescanLimits)}
    return DecodeLimits(prescan=PrescanLimits(**prescan), max_request_pixels=settings.max_request_pixels)


def create_app(settings: Settings, *, tracer: Tracer | None = None) -> FastAPI:
    """Build the application for ``settings``.

    Args:
        settings: the validated settings.
        tracer: OpenTelemetry tracing of requests and batches (:mod:`service.core.tracing`); None: off.
            The app makes it the process's tracer while it runs and shuts it down at the end.

    Raises:
        RepositoryError: the model repository or a manifest is invalid.
    """
    validate_repository(settings)
    libtiff.silence()  # its messages would go to stderr, one per bad line of a client's TIFF
    threads = thread_plan(settings)
    decode_threads = threads.decode_threads
    state = ServerState(
        settings,
        DecodePool(decode_threads, thread_name_prefix=DECODE_THREADS),  # (logs: Pillow's words there are DEBUG)
        ThreadPoolExecutor(1, thread_name_prefix="render"),  # one picture at a time, beside the decoders
        decode_parallelism=max(1, decode_threads // 2),  # one request never holds the whole pool
        threads=threads,
        decode_limits=decode_limits(settings),
        pixel_budget=PixelBudget(settings.max_decoding_pixels),
        workers=worker_readiness(settings),
    )
    trim = malloc_trim()
    state.idle_trim = IdleTrim(trim) if trim is not None else None
    log.info("threads: %s", threads.reason)
    swaps = VersionSwaps(
        loader(settings, threads, tuner(settings)),
        ModelRepository(settings.model_repository),
        drain_margin=settings.body_timeout,
    )
    state.control = control = ModelControl(settings.model_repository, swaps, signal=control_signal(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if tracer is not None:
            install(tracer)
        loading = asyncio.create_task(_start_models(state, control))
        watchers = []
        if settings.repository_poll_seconds > 0:
            watchers.append(asyncio.create_task(poll_forever(state, loading, settings.repository_poll_seconds)))
        if control.signal is not None:
            watchers.append(asyncio.create_task(follow(state, loading, control.signal)))
        yield
        state.draining = True
        if state.workers is not None:
            state.workers.clear()
        await loading
        for watcher in watchers:
            watcher.cancel()
        if watchers:
            await asyncio.wait(watchers)
        with contextlib.suppress(TimeoutError):  # versions retiring finish their requests, which have ended
            await asyncio.wait_for(control.until_retired(), settings.graceful_shutdown_timeout)
        if state.repository is not None:
            for model in state.repository.all():
                await model.batcher.stop()
        state.decode_pool.shutdown(wait=False, cancel_futures=True)
        state.render_pool.shutdown(wait=False, cancel_futures=True)
        if tracer is not None:
            install(None)
            await asyncio.to_thread(tracer.shutdown)  # flushes the spans still buffered

    app = FastAPI(
        title="patchserve",
        version=VERSION,
        description="Vision transformers (ViT classifiers, DETR detectors) on ONNX Runtime, with dynamic batching.",
        lifespan=lifespan,
        redirect_slashes=False,  # a POST to .../classify/ is a 404 problem, not a 307 curl will not follow
        docs_url=None,  # install_docs serves /docs and /redoc from local assets instead of a CDN
        redoc_url=None,
    )
    docs.install_docs(app)
    app.state.server = state
    install_handlers(app)
    app.include_router(health.router)
    app.include_router(models.router)
    inference_routes = inference.build_router()  # one route per registered task
    app.include_router(inference_routes)
    app.include_router(metrics.router)
    app.include_router(repository.router)  # before v2's catch-all
    app.include_router(v2.router)
    if settings.playground:
        app.include_router(playground.router)
    app.add_middleware(DirectInference, routes=inference_routes.routes)  # innermost: past the router
    app.add_middleware(HeadAsGet)  # HEAD wherever GET is served
    app.add_middleware(
        AdmissionMiddleware,
        max_in_flight=settings.max_in_flight,
        body_timeout=settings.body_timeout,
        drain_bytes=settings.max_body_bytes,
        max_buffered_bytes=settings.max_buffered_bytes,
        exempt=admission_exempt,
        idle=state.idle_trim,
    )
    public = docs.PUBLIC_PATHS + (playground.PUBLIC_PATHS if settings.playground else ())
    keyless = add_security_middleware(app, settings, public)  # outside admission: a request without a key takes no slot
    if keyless is not None:
        openapi.declare_bearer(app, keyless)
    app.add_middleware(AccessLogMiddleware)
    if tracer is not None:  # inside the request id (which it records), outside everything that may refuse
        app.add_middleware(TracingMiddleware, tracer=tracer, untraced=admission_exempt)  # probes: not traced
    app.add_middleware(RequestIdMiddleware)  # outermost: every line and problem carries the request id
    return app


def build_app() -> FastAPI:
    """Factory for ``uvicorn --factory``: settings (and ``OTEL_*`` tracing) from the environment."""
    return create_app(load_settings(), tracer=from_environment(os.environ))
