"""One version at a time: loaded, validated and warmed up off the event loop, swapped in; retired, drained, released.

:class:`VersionSwaps` carries out what :class:`~service.runtime.model_control.ModelControl` decides
(which versions should serve), one version at a time, on one worker's
:class:`~service.runtime.repository.ModelRepository` (the routing table), and keeps the states of
the versions that do not (or not only) serve.

**Swap.** A new version is loaded in a worker thread (manifest, sessions, the graph's input and
outputs checked against the manifest, the auto-tuner's cached result, one warm-up run per batch
size), so requests to every other version go on meanwhile; only then is its batcher started and
it enters the routing table. The event loop makes that one step: a request sees the old table or the new one.

**Retire.** A version the policy no longer selects (or whose folder went, or whose model was
unloaded) leaves the routing table at once: no new request reaches it. Requests that reached it
hold it (:meth:`ModelRepository.use`) until answered; once none holds it (or after its request
timeout and ``drain_margin`` seconds) its batcher stops, its sessions and buffers are let go, and
it is listed ``UNAVAILABLE`` ``"unloaded"`` (Triton's) until its folder goes.

**Failure.** A version that fails to load never enters the table, so it never displaces the one
serving: the policy then selects among the others (loading the next one it picks), and the failure
is logged, counted in ``patchserve_model_loads_total{outcome="failure"}`` and shown with its reason
until its files change (the poller then tries again) or a load asks again; a version rewritten in
place whose new files fail stays ``READY`` on its earlier ones, with that reason.

Every method but :meth:`VersionSwaps.record_failure` runs on the event loop; model control makes one
change at a time (its lock). ``record_failure`` is also called from start-up's loading thread, before
any model serves but while the repository routes answer: their reads of :attr:`VersionSwaps.states`
(one ``dict`` copy or sort each) and its one assignment are each a single step under the GIL.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field

from service.core import metrics
from service.core.errors import RepositoryError
from service.runtime.loading import Loader
from service.runtime.repository import ModelRepository, ModelVersion
from service.runtime.repository_folder import Fingerprint, Found, fingerprint

log = logging.getLogger(__name__)

LOADING, READY, UNLOADING, UNAVAILABLE = "LOADING", "READY", "UNLOADING", "UNAVAILABLE"  # Triton's states


@dataclass
class VersionState:
    """A version that is not (or not only) serving: loading, unloading, or unavailable with a reason."""

    state: str
    reason: str = ""
    fingerprint: Fingerprint | None = None  # the files that failed: tried again once they change
    failed: bool = False  # its last load failed (UNAVAILABLE, or READY on earlier files; else: unloaded)


@dataclass
class VersionSwaps:
    """One worker's loads, swaps and retirements of single versions (see the module's docstring).

    Args:
        loader: loads one version (blocking).
        repository: the routing table it changes.
        drain_margin: seconds past a retiring version's own request timeout (its manifest's
            ``batching.request_timeout``, else the setting) that it waits for its requests before
            it is released: by then each of them has had its answer or its 504.
    """

    loader: Loader
    repository: ModelRepository
    drain_margin: float = 30.0
    states: dict[str, dict[int, VersionState]] = field(default_factory=dict)
    serving: dict[tuple[str, int], Fingerprint | None] = field(default_factory=dict)  # files of each routed version
    _retiring: set[asyncio.Task[None]] = field(default_factory=set)

    def adopt(self, model: ModelVersion) -> None:
        """A version loaded at start-up (its batcher started): route it and count its load."""
        self.serving[(model.name, model.version)] = fingerprint(model.path)
        self.repository.add(model)
        _loaded(model)

    def record_failure(
        self, name: str, version: int, files: Fingerprint | None, exc: Exception, *, at_startup: bool = False
    ) -> None:
        """Record that ``version`` of ``name`` failed to load from ``files`` (raising ``exc``).

        Logged as an error saying what follows (at start-up the version's policy picks among the
        rest; later what serves is unchanged), counted in
        ``patchserve_model_loads_total{outcome="failure"}`` and listed ``UNAVAILABLE`` with its
        reason (a :class:`~service.core.errors.RepositoryError`'s message, else the exception's type
        and message) until ``files`` change or a load asks again.
        """
        reason = str(exc) if isinstance(exc, RepositoryError) else f"{type(exc).__name__}: {exc}"
        then = " at start-up; its policy picks among the rest" if at_startup else "; what serves is unchanged"
        log.error("model %s version %d: failed to load%s: %s", name, version, then, reason)
        metrics.MODEL_LOADS.labels(name, str(version), "failure").inc()
        self.states.setdefault(name, {})[version] = VersionState(UNAVAILABLE, reason, files, failed=True)

    async def load(self, name: str, version: int, found: Found) -> bool:
        """Load, check and warm up one version off the event loop, then route it. Returns success."""
        states = self.states.setdefault(name, {})
        states[version] = VersionState(LOADING)
        routed = self.repository.models.get(name, {})
        serving = routed[max(routed)] if routed else None
        log.info("model %s version %d: loading %s while serving", name, version, found.folder)
        try:
            model = await asyncio.get_running_loop().run_in_executor(
                None, self._load_blocking, name, version, found, serving
            )
        except Exception as exc:
            self.record_failure(name, version, found.fingerprint, exc)
            await asyncio.to_thread(gc.collect)  # the failed sessions' memory goes back now
            return False
        await model.batcher.start()
        del states[version]
        self.serving[(name, version)] = found.fingerprint
        replaced = self.repository.add(model)
        _loaded(model)
        log.info("model %s version %d: serving", name, version)
        if replaced is not None:  # the same version number with new files: the old sessions retire
            replaced.retiring = True
            self.retire(replaced, "")
        return True

    def _load_blocking(self, name: str, version: int, found: Found, serving: ModelVersion | None) -> ModelVersion:
        model = self.loader.load(name, version, found.folder, live=True, serving=serving)
        if not model.runner.providers.ok:
            raise RuntimeError(model.runner.providers.reason)
        model.warm_up()
        return model

    def retire(self, model: ModelVersion, reason: str) -> None:
        """``model`` is out of the routing table: finish its requests in the background, then release it.

        Args:
            reason: listed with it (``UNAVAILABLE``) once released; "": forgotten then (new files of
                the same version serve in its place).
        """
        states = self.states.setdefault(model.name, {})
        if model.version not in self.repository.models.get(model.name, {}):
            states[model.version] = VersionState(UNLOADING, reason)
        task = asyncio.create_task(self._drain(model, reason), name=f"retire-{model.name}-{model.version}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def drain_timeout(self, model: ModelVersion) -> float:
        """Most seconds retiring ``model`` waits for its requests: its request timeout and ``drain_margin``."""
        return model.batcher.config.request_timeout + self.drain_margin

    async def _drain(self, model: ModelVersion, reason: str) -> None:
        log.info("model %s version %d: retiring; finishing its %d request(s)", model.name, model.version, model.users)
        drain_timeout = self.drain_timeout(model)
        try:
            await asyncio.wait_for(model.until_unused(), drain_timeout)
        except TimeoutError:
            log.warning("model %s version %d: %d request(s) still held it after %.0f s; releasing it anyway",
                        model.name, model.version, model.users, drain_timeout)  # fmt: skip
        await model.release()
        states = self.states.get(model.name, {})
        if model.version not in self.repository.models.get(model.name, {}):  # (else: new files of it serve)
            labels = (model.name, str(model.version), model.manifest.task, model.runner.providers.primary)
            metrics.MODEL_INFO.labels(*labels).set(0)
            self.serving.pop((model.name, model.version), None)
            if states.get(model.version, VersionState("")).state == UNLOADING:
                if reason:
                    states[model.version] = VersionState(UNAVAILABLE, reason)
                else:
                    del states[model.version]
        if not states:
            self.states.pop(model.name, None)
        log.info("model %s version %d: released", model.name, model.version)

    async def until_retired(self) -> None:
        """Wait until every retiring version has been released (tests; shutdown)."""
        while self._retiring:
            await asyncio.wait(set(self._retiring))


def _loaded(model: ModelVersion) -> None:
    metrics.MODEL_LOADS.labels(model.name, str(model.version), "success").inc()
    info = (model.name, str(model.version), model.manifest.task, model.runner.providers.primary)
    metrics.MODEL_INFO.labels(*info).set(1)
    metrics.export_choices(model)
