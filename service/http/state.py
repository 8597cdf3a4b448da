"""What one worker process holds while it serves: settings, models, the decode pool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from service.core.lifecycle import shutdown_requested
from service.core.memory import IdleTrim
from service.core.settings import Settings
from service.imaging.pixel_budget import PixelBudget
from service.pipeline.inference import DecodeLimits
from service.pipeline.pool import DecodePool
from service.runtime.cpus import ThreadPlan
from service.runtime.model_control import ModelControl
from service.runtime.repository import ModelRepository
from service.runtime.worker_readiness import WorkerReadiness


@dataclass
class ServerState:
    """The per-process state the routes reach through ``request.app.state.server``.

    Attributes:
        settings: the validated settings.
        decode_pool: threads that decode and preprocess images.
        render_pool: the one thread that draws ``render=png`` pictures (one at a time, apart
            from decoding, so a large picture never holds up other requests' images).
        repository: the loaded models (None until start-up has loaded them).
        draining: set when shutdown begins; readiness turns 503 at once (as it does as soon as
            the process receives SIGTERM, see :mod:`service.core.lifecycle`).
        startup_error: why loading failed, if it did.
        threads: the thread plan chosen from the usable cores (None: the settings' plain values).
        decode_limits: the pre-scan's and one request's pixel limits (from the settings).
        pixel_budget: the decoded pixels this worker holds at once (``max_decoding_pixels``).
        control: loads and retires model versions while serving (:mod:`service.runtime.model_control`).
        workers: with several worker processes, their shared readiness (:mod:`service.runtime.worker_readiness`).
        idle_trim: gives freed memory back once the worker is idle (None where the C library cannot).
    """

    settings: Settings
    decode_pool: DecodePool
    render_pool: ThreadPoolExecutor
    repository: ModelRepository | None = None
    decode_parallelism: int = 1
    draining: bool = False
    startup_error: str = ""
    threads: ThreadPlan | None = None
    decode_limits: DecodeLimits = field(default_factory=DecodeLimits)
    pixel_budget: PixelBudget | None = None
    control: ModelControl | None = None
    workers: WorkerReadiness | None = None
    idle_trim: IdleTrim | None = None

    def not_ready_reasons(self) -> list[str]:
        """Why the server is not ready; empty when it is."""
        if self.startup_error:
            return [self.startup_error]
        if self.draining or shutdown_requested():
            return ["the server is draining (shutting down)"]
        if self.repository is None:
            return ["models are still loading"]
        reasons = [f"{m.name}/{m.version}: {m.not_ready_reason}" for m in self.repository.all() if not m.ready]
        if not reasons and self.workers is not None and (others := self.workers.not_ready_reason()):
            reasons.append(others)
        return reasons
