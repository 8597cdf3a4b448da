"""Which versions of a model are served: Triton's ``version_policy``, read from ``<name>/config.json``.

A model folder may hold ``config.json`` beside its version folders (Triton keeps the same in
``config.pbtxt``); of it, only ``version_policy`` is read, in Triton's JSON form::

    {"version_policy": {"latest": {"num_versions": 2}}}     # the 2 highest versions
    {"version_policy": {"all": {}}}                         # every version
    {"version_policy": {"specific": {"versions": [1, 3]}}}  # exactly these

Without the file (or without ``version_policy``) a model serves its highest version only:
Triton's default, ``latest: 1``. A request without a ``version`` goes to the highest version
served. The policy is applied to the versions that can be served (complete on disk and not
failed to load), so a version that fails to load never displaces the one serving: with
``latest: 1``, version 1 keeps serving while a broken version 2 sits beside it.

The load API (``POST /v2/repository/models/{name}/load``) may pass a config with a policy of
its own (tritonclient's ``load_model(config=...)``): it holds until the next load without one
or an unload, as in Triton.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

CONFIG_FILE = "config.json"
Folder = TypeVar("Folder")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_booleans(value: Any) -> Any:
    """A count or versions as given, unless JSON's ``true``/``false`` (which pydantic reads as 1 and 0).

    Numbers in strings stay accepted: protobuf's JSON form, Triton's, writes int64s so (``["1", "3"]``).
    """
    if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
        raise ValueError("versions and counts are JSON integers, not true or false")
    return value


class Latest(_Strict):
    num_versions: Annotated[int, BeforeValidator(_no_booleans)] = Field(
        1, ge=1, description="How many of the highest versions are served."
    )


class All(_Strict):
    pass


class Specific(_Strict):
    versions: Annotated[list[int], BeforeValidator(_no_booleans)] = Field(
        min_length=1, description="The versions served (each one that exists)."
    )

    @field_validator("versions")
    @classmethod
    def _once_each(cls, versions: list[int]) -> list[int]:
        return list(dict.fromkeys(versions))  # [1, 1, 3] is [1, 3], as shown back in GET /v1/models


class VersionPolicy(_Strict):
    """Exactly one of ``latest``, ``all`` or ``specific`` (Triton's ``ModelVersionPolicy``).

    Raises:
        pydantic.ValidationError: none or several of them given, or a field out of range.
    """

    latest: Latest | None = None
    all: All | None = None
    specific: Specific | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionPolicy:
        given = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of latest, all, specific (got {given or 'none'})")
        return self

    def select(self, available: Iterable[int]) -> set[int]:
        """The versions to serve of ``available`` (those that can be served)."""
        versions = sorted(set(available))
        if self.latest is not None:
            return set(versions[-self.latest.num_versions :])
        if self.specific is not None:
            return set(versions) & set(self.specific.versions)
        return set(versions)

    def describe(self) -> dict[str, Any]:
        """The policy as Triton writes it, e.g. ``{"latest": {"num_versions": 1}}``."""
        return self.model_dump(exclude_none=True)


DEFAULT_POLICY = VersionPolicy(latest=Latest(num_versions=1))


class ModelConfig(_Strict):
    """The part of a model's ``config.json`` this server reads; other keys (Triton's) are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    version_policy: VersionPolicy = DEFAULT_POLICY


class ConfigError(Exception):
    """A ``config.json`` (or a load request's config) that is not valid, naming the file and field."""


def once_each_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict; a key given twice (which json.loads lets the last win) is refused."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = sorted({key for key in keys if keys.count(key) > 1})
        raise ValueError(f"{', '.join(map(repr, twice))} given twice in one object")
    return dict(pairs)


def parse_config(text: str, source: str, *, loading: str | None = None) -> ModelConfig:
    """A model config from JSON text.

    Args:
        loading: the model a load request's config is for: keys other than ``version_policy``
            (and ``name``, when it is this model's) are refused, as Triton would apply them and this
            server would not; None: a ``config.json``, which may hold Triton's other keys.

    Raises:
        ConfigError: not JSON (a key twice in one object included), not an object, an invalid
            ``version_policy``, or, ``loading``, another key or another model's name (the message
            names ``source``).
    """
    try:
        data = json.loads(text, object_pairs_hook=once_each_key)
    except ValueError as exc:
        raise ConfigError(f"{source}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f'{source}: must be a JSON object such as {{"version_policy": {{"all": {{}}}}}}')
    if loading is not None and "name" in data and data["name"] != loading:  # Triton's configs name their model
        raise ConfigError(f"{source}: name is {data['name']!r}, but the load is for {loading!r}")
    if loading is not None and (others := sorted(set(data) - {"version_policy", "name"})):
        raise ConfigError(
            f"{source}: {', '.join(map(repr, others))} would be ignored: of a model configuration this server "
            "reads only version_policy (batching and the rest come from each version's model.json)"
        )
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{source}: {field}: {first['msg']}") from None


def read_config(model_dir: Path) -> ModelConfig:
    """``<model_dir>/config.json``, or the defaults when there is none.

    Raises:
        ConfigError: the file exists but is unreadable or invalid.
    """
    path = model_dir / CONFIG_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ModelConfig()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    return parse_config(text, str(path))


def apply_policies(
    versions: Mapping[str, Mapping[int, Folder]], policy: Callable[[str], VersionPolicy]
) -> list[tuple[str, int, Folder]]:
    """(name, version, folder) of every version that its model's ``policy(name)`` selects of
    ``versions`` (name -> version -> folder), in name order as given, versions ascending.

    Raises:
        Whatever ``policy`` raises (e.g. :class:`ConfigError`).
    """
    chosen = []
    for name, folders in versions.items():
        chosen += [(name, version, folders[version]) for version in sorted(policy(name).select(folders))]
    return chosen
