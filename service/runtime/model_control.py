"""Changing what is served while serving: which versions should serve, and the repository API.

:class:`ModelControl` keeps one worker's :class:`~service.runtime.repository.ModelRepository` (the
routing table) in line with the repository folder and each model's version policy
(:mod:`service.runtime.version_policy`). It is driven by the poller (:mod:`service.runtime.repository_watch`,
``PATCHSERVE_REPOSITORY_POLL_SECONDS``) and by the repository API
(``POST /v2/repository/models/{name}/load|unload``, :mod:`service.http.routes.repository`). It decides;
its :class:`~service.runtime.version_swaps.VersionSwaps` loads, swaps in, retires and releases each
version (the swap, the retirement and a failure are described there).

**A version counts** once its folder holds ``model.json`` and ``model.onnx`` (a folder whose name
starts with a dot is ignored). The poller also waits until both files' sizes and modification
times are the same at two polls in a row, so a copy still being written is not loaded half-way;
publishing atomically (write ``.2.partial/``, then rename it to ``2``) makes that wait harmless.
The load API takes the folder as it is at once.

**Failure.** A version that fails to load never displaces the one serving: the policy then selects
among the others (loading the next one it picks), and the version is tried again once its files
change (the poller) or a load asks again.

Every method runs on the event loop, but for what start-up's loading thread calls before the
worker serves (:meth:`ModelControl.startup_versions`, and the :meth:`ModelControl.scan` and
:meth:`ModelControl.policy` under it); one change at a time (a lock), so two loads never compete.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from service.core.errors import BadRequest
from service.runtime.control_signal import ControlSignal
from service.runtime.repository import NAME_PATTERN, ModelRepository, ModelVersion
from service.runtime.repository_folder import Fingerprint, Found, scan
from service.runtime.version_policy import ConfigError, VersionPolicy, apply_policies, read_config
from service.runtime.version_swaps import READY, UNAVAILABLE, VersionState, VersionSwaps

log = logging.getLogger(__name__)


@dataclass
class ModelControl:
    """One worker's model control: what should serve, and the repository API (see the module's docstring).

    Args:
        root: the repository folder.
        swaps: loads, swaps in, retires and releases one version at a time, on the routing table it
            holds (:attr:`repository`), with the loader and drain margin it holds.
        signal: with several workers, what tells the others of the load API's changes (None: one worker).
    """

    root: Path
    swaps: VersionSwaps
    signal: ControlSignal | None = None  # with several workers: API changes go to every worker
    overrides: dict[str, VersionPolicy] = field(default_factory=dict)  # from the load API's config
    unloaded: set[str] = field(default_factory=set)  # unloaded by the API: not served until loaded again
    config_errors: dict[str, str] = field(default_factory=dict)
    _seen: dict[tuple[str, int], Fingerprint | None] = field(default_factory=dict)  # at the previous poll
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _warned: set[str] = field(default_factory=set)

    @property
    def repository(self) -> ModelRepository:
        """The routing table it keeps in line (the swaps')."""
        return self.swaps.repository

    @property
    def states(self) -> dict[str, dict[int, VersionState]]:
        """Each model's versions not (or not only) serving, by version (the swaps')."""
        return self.swaps.states

    # What is on disk, and what should serve.

    def scan(self, names: set[str] | None = None) -> dict[str, dict[int, Found]]:
        """:func:`service.runtime.repository_folder.scan` of the root, warning once per ignored folder.

        Raises:
            OSError: as that function (the caller changes nothing on a partial view).
        """
        return scan(self.root, names, self._warn_once)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def policy(self, name: str) -> VersionPolicy:
        """The model's version policy: the load API's, else its config.json's, else ``latest: 1``.

        Raises:
            ConfigError: its config.json is invalid.
        """
        return self.overrides.get(name) or read_config(self.root / name).version_policy

    def startup_versions(self) -> list[tuple[str, int, Path]]:
        """(name, version, folder) of each version to load at start-up: every model's policy applied
        to its complete versions but those that failed to load (the policy selects among the others).

        Raises:
            ConfigError: a model's config.json is invalid.
        """
        failed = {(name, v) for name, states in self.states.items() for v, state in states.items() if state.failed}
        on_disk = self.scan().items()
        complete = {n: {v: f for v, f in vs.items() if f.fingerprint and (n, v) not in failed} for n, vs in on_disk}
        chosen = apply_policies(complete, self.policy)
        for name, version, found in chosen:
            self._seen[(name, version)] = found.fingerprint
        return [(name, version, found.folder) for name, version, found in chosen]

    def adopt(self, model: ModelVersion) -> None:
        """Route a version start-up loaded and count its load: :meth:`VersionSwaps.adopt`."""
        self.swaps.adopt(model)

    async def until_retired(self) -> None:
        """:meth:`VersionSwaps.until_retired`: every retiring version released (tests; shutdown)."""
        await self.swaps.until_retired()

    # Changes.

    async def sync(self, names: set[str] | None = None, *, settled: bool = True, force: bool = False) -> None:
        """Bring the served versions in line with the folder and the policies (of ``names``, or all).

        Args:
            settled: count a version only once its files are as they were at the previous call
                (the poller); False: as they are now (the load API).
            force: try again versions that failed with the same files (the load API).
        """
        async with self._lock:
            try:
                found = self.scan(names)
            except OSError as exc:
                self._warn_once(f"the model repository {self.root} could not be scanned ({exc}); serving is unchanged")
                return
            targets = set(found) | set(self.repository.models) | set(self.states)
            for name in sorted(targets if names is None else names):
                await self._sync_model(name, found.get(name, {}), settled=settled, force=force)

    async def _sync_model(self, name: str, found: dict[int, Found], *, settled: bool, force: bool) -> None:
        routed = self.repository.models.get(name, {})
        states = self.states.setdefault(name, {})
        for version in [v for v, s in states.items() if s.state == UNAVAILABLE and v not in found]:
            del states[version]  # its folder went: forget its failure
        loadable: dict[int, Found]
        kept: set[int]
        if name in self.unloaded:
            loadable, kept, policy = {}, set(), None
        else:
            try:
                policy = self.policy(name)
                self.config_errors.pop(name, None)
            except ConfigError as exc:
                if self.config_errors.get(name) != str(exc):
                    log.error("model %s: %s; what it serves is unchanged", name, exc)
                self.config_errors[name] = str(exc)
                return
            loadable, kept = self._candidates(name, found, routed, states, settled=settled, force=force)
        available = set(loadable) | kept
        tried = {v for v in routed if v in loadable and self.swaps.serving.get((name, v)) == loadable[v].fingerprint}
        failed = False
        while True:  # a failure leaves a version out, and the policy may then select one not loaded yet
            wanted = policy.select(available) if policy is not None else set()
            todo = [v for v in sorted(wanted - tried, reverse=True) if v in loadable]  # (tried: or serving these files)
            if not todo:  # (the highest first: it takes the unversioned requests)
                break
            for version in todo:
                tried.add(version)
                if not await self.swaps.load(name, version, loadable[version]) and version not in routed:
                    available.discard(version)
                    failed = True
        pending = set(found) - available  # folders that failed, or are not complete (or settled) yet
        if policy is not None and routed and not wanted and policy.select(available | pending):
            # A policy that selects only versions that cannot serve (e.g. "specific: [2]" with a broken
            # or half-copied version 2) would retire what serves and leave nothing: keep it, at every
            # poll, until a version it selects can serve (Triton: a failed load keeps what is loaded).
            if failed:
                log.error("model %s: no version its policy selects could be loaded; what serves is unchanged", name)
            wanted = set(routed)
        for version in sorted(set(self.repository.models.get(name, {})) - wanted):  # listed "unloaded", as Triton
            self.swaps.retire(self.repository.remove(name, version), "unloaded")  # (forgotten once its folder goes)
        if not states:
            self.states.pop(name, None)

    def _candidates(
        self, name: str, found: dict[int, Found], routed: dict[int, ModelVersion], states: dict[int, VersionState],
        *, settled: bool, force: bool,
    ) -> tuple[dict[int, Found], set[int]]:  # fmt: skip
        """(versions that may be loaded now, routed versions kept as they are though their files changed)."""
        loadable, kept = {}, set()
        for version, entry in found.items():
            key, fp = (name, version), entry.fingerprint
            previous, self._seen[key] = self._seen.get(key), fp
            failed = states.get(version)
            complete = fp is not None and (not settled or previous == fp or self.swaps.serving.get(key) == fp)
            if complete and (force or failed is None or not failed.failed or failed.fingerprint != fp):
                loadable[version] = entry
            elif version in routed:
                kept.add(version)  # still being written, or the rewrite failed: the old files' sessions serve
        return loadable, kept

    # The load API.

    async def load(self, name: str, policy: VersionPolicy | None = None, *, signal: bool = True) -> None:
        """Load (or load again) model ``name`` as its folder holds it now: Triton's load.

        Args:
            policy: a version policy for this model until the next load without one or an unload.
            signal: tell the other workers too (False: applying another worker's signal).

        Raises:
            BadRequest: no such model folder, or a version its policy selects failed to load (400).
        """
        if not NAME_PATTERN.match(name) or not (self.root / name).is_dir():
            raise BadRequest(f"no model folder {name!r} in the model repository")
        self._refuse_an_empty_selection(name, policy)
        if signal and self.signal is not None:
            self.signal.publish(name, "load", policy)
        self.unloaded.discard(name)
        self.overrides.pop(name, None)
        if policy is not None:
            self.overrides[name] = policy
        await self.sync({name}, settled=False, force=True)
        if name in self.config_errors:
            raise BadRequest(f"failed to load {name!r}: {self.config_errors[name]}")
        states = self.states.get(name, {})
        try:  # a failed version its policy leaves out (among those serving and failed) is no failure of this load
            selected = self.policy(name).select(set(self.repository.models.get(name, {})) | set(states))
        except (OSError, ConfigError):  # the folder changed under the load: every failure counts
            selected = set(states)
        if failed := {v: s.reason for v, s in states.items() if s.failed and v in selected}:
            reasons = "; ".join(f"version {v}: {r}" for v, r in sorted(failed.items()))
            raise BadRequest(f"failed to load {name!r}: {reasons}")
        if name not in self.repository.models:  # an unload that came in meanwhile is the later change: it stands
            why = "an unload of it came in while it loaded" if name in self.unloaded else "no complete version folder"
            raise BadRequest(f"failed to load {name!r}: {why}{'' if name in self.unloaded else ' its policy selects'}")

    def _refuse_an_empty_selection(self, name: str, policy: VersionPolicy | None) -> None:
        """Raise BadRequest, changing nothing, when ``policy`` (else the config's) selects no complete version folder.

        A load refused must leave serving as it was (Triton: a failed load keeps what is loaded).
        """
        try:
            versions = self.scan({name}).get(name, {})
            chosen = policy or read_config(self.root / name).version_policy
        except (OSError, ConfigError):
            return  # the load itself reports these, and they change nothing either
        complete = sorted(v for v, entry in versions.items() if entry.fingerprint is not None)
        if not chosen.select(complete):
            raise BadRequest(
                f"failed to load {name!r}: its version policy {chosen.describe()} selects none of its complete "
                f"version folders {complete}; what serves is unchanged"
            )

    async def unload(self, name: str, *, signal: bool = True) -> None:
        """Stop serving model ``name`` (every version) until it is loaded again: Triton's unload.

        Returns at once; its versions finish their requests in the background, then are released.
        With ``signal`` the other workers are told too (False: applying another worker's signal).

        Raises:
            BadRequest: no such model (400).
        """
        if name not in self.repository.models and not (NAME_PATTERN.match(name) and (self.root / name).is_dir()):
            raise BadRequest(f"no model {name!r} to unload")
        if signal and self.signal is not None:
            self.signal.publish(name, "unload", None)
        async with self._lock:
            self.unloaded.add(name)
            self.overrides.pop(name, None)
            for version in sorted(self.repository.models.get(name, {})):
                self.swaps.retire(self.repository.remove(name, version), "unloaded")

    # What is served, for the index and GET /v1/models.

    def not_serving(self, name: str) -> dict[int, VersionState]:
        """Model ``name``'s versions that are loading, unloading or unavailable, by version, lowest first.

        A serving version whose files were rewritten and failed is ``READY`` here (still ``failed``),
        with the reason "serving earlier files; new ones failed: <reason>": its earlier files serve;
        its new ones do not.
        """
        routed = self.repository.models.get(name, {})
        return {
            v: VersionState(READY, f"serving earlier files; new ones failed: {s.reason}", s.fingerprint, failed=True)
            if s.failed and v in routed
            else s
            for v, s in sorted(self.states.get(name, {}).items())
        }

    def index(self) -> list[dict[str, str]]:
        """Every model in the folder or served, by version: Triton's repository index entries."""
        try:
            on_disk = set(self.scan())
        except OSError:
            on_disk = set()
        names = set(self.repository.models) | set(self.states) | on_disk | set(self.config_errors)
        entries = []
        for name in sorted(names):
            versions = {v: VersionState(READY) for v in self.repository.models.get(name, {})}
            for version, state in self.not_serving(name).items():
                if version not in versions or state.failed:  # (serving: its new files failed, its earlier ones serve)
                    versions[version] = state
            for version, state in sorted(versions.items()):
                entries.append({"name": name, "version": str(version), "state": state.state, "reason": state.reason})
            if not versions:
                reason = self.config_errors.get(name) or (
                    "unloaded" if name in self.unloaded else "no version to serve"
                )
                entries.append({"name": name, "version": "", "state": UNAVAILABLE, "reason": reason})
        return entries
