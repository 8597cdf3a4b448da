"""The task seam: what one task declares (:class:`Task`) and the registry that finds it.

A task is what a route verb does with a model's outputs: ``classify`` reads class logits,
``detect`` reads DETR's set of boxes, ``embed`` reads the pooled representation. Everything
specific to one task lives in its own module of :mod:`service.tasks`, which registers one
:class:`Task`; the core (the manifest, the generic route handler, admission, OpenAPI, v2,
``export/`` and ``bench/``) asks the registry and never compares a task's name (timm's
``@register_model``, detr's ``build()`` returning its post-processors by name, LitServe's
``LitAPI``).

A model version serves its manifest's ``task``, plus every *companion* task (embeddings) whose
output roles its manifest names: a ViT classifier exported with an ``embedding`` output
serves both ``classify`` and ``embed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from service.imaging.images import DecodedImage
    from service.pipeline.inference import ImageOutcome
    from service.runtime.manifest import Manifest
    from service.runtime.repository import ModelVersion

P = TypeVar("P", bound=BaseModel)
"""A task's ``Params`` type: what its ``fields`` and ``picture`` receive."""


@runtime_checkable
class Task(Protocol[P]):
    """What one task declares; every attribute is read by the generic route and the manifest.

    Attributes:
        name: the manifest's ``task`` value and the ``model_info`` metric's label, e.g.
            a classifier's name.
        verb: the route, ``POST /v1/models/{name}/{verb}``; unique among tasks.
        summary: the route's OpenAPI summary.
        roles: the output roles the task reads, e.g. ``("logits", "boxes")``. A manifest names
            its outputs' roles in ``roles``; one without them (the list form of ``outputs``)
            gets its task's roles in the order of ``outputs``.
        companion: True when any model whose manifest names all of ``roles`` serves this
            task beside its own (embeddings); False when only models of this task do.
        Params: the route's query parameters (a pydantic model); ``version`` and ``timeout``
            are every route's and not part of it. A ``render`` field (``"json"`` | ``"png"``)
            asks for :meth:`picture`.
        Options: the manifest's ``task_options``: the variants of the post-processing a model
            of this task needs (e.g. how a detector's scores are read), validated on load.
        result_schema: the JSON schema of one image's response body.
        picture_help: what ``render=png`` draws, for the docs; None when the task draws nothing.
    """

    # Read-only members (properties), so that a task's class attributes of narrower types (a
    # ``tuple[str]`` of roles) satisfy the protocol; the docstring above says what each means.
    @property
    def name(self) -> str: ...
    @property
    def verb(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def roles(self) -> tuple[str, ...]: ...
    @property
    def companion(self) -> bool: ...
    @property
    def Params(self) -> type[P]: ...  # noqa: N802  (the attribute's name: a class)
    @property
    def Options(self) -> type[BaseModel]: ...  # noqa: N802
    @property
    def result_schema(self) -> dict[str, Any]: ...
    @property
    def picture_help(self) -> str | None: ...

    def check_manifest(self, manifest: Manifest) -> None:
        """Refuse a manifest of this task that cannot be served (raise ValueError naming the field)."""

    def fields(self, model: ModelVersion, outcome: ImageOutcome, params: P) -> dict[str, Any]:
        """The task's fields of one successful image's response (beside model, version, image).

        Args:
            model: the model version that ran (its manifest, labels, preprocessor).
            outcome: the image's decoded form and its row of every graph output.
            params: the request's validated ``Params``.
        """

    def draws(self, model: ModelVersion) -> bool:
        """Whether :meth:`picture` can draw for ``model`` (an ``Accept: image/png`` gets JSON when not)."""

    def picture(self, model: ModelVersion, outcome: ImageOutcome, fields: dict[str, Any], params: P) -> bytes:
        """PNG bytes for ``render=png`` of one image, given the fields :meth:`fields` returned.

        Blocking (draws and encodes): the route runs it in its own one-thread pool, never the
        decode pool, within the request's deadline. A picture has at most
        :data:`~service.imaging.render.MAX_PICTURE_PIXELS` pixels.

        Raises:
            ProblemError: the model cannot draw this (e.g. no attention maps: 422).
        """


class NoOptions(BaseModel):
    """``task_options`` of a task that has no variants: none accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BaseTask(Generic[P]):
    """Defaults for a :class:`Task`: not a companion, no options, no manifest checks, no picture.

    A task derives ``BaseTask[<its Params>]``, so that its ``fields`` and ``picture`` may take its
    own ``Params`` (what the generic route validates and passes) and still satisfy :class:`Task`.
    """

    companion: ClassVar[bool] = False
    Options: type[BaseModel] = NoOptions
    picture_help: str | None = None

    def check_manifest(self, manifest: Manifest) -> None:
        """No checks beyond the manifest's own."""

    def draws(self, model: ModelVersion) -> bool:
        """A task that draws at all draws for every model of it."""
        return self.picture_help is not None

    def picture(self, model: ModelVersion, outcome: ImageOutcome, fields: dict[str, Any], params: P) -> bytes:
        """Never called: ``picture_help`` is None."""
        raise NotImplementedError


_TASKS: dict[str, Task[Any]] = {}


def register(task: Task[P]) -> Task[P]:
    """Add ``task`` to the registry; returns it.

    Raises:
        ValueError: another task has its name or verb, or it lacks a :class:`Task` attribute.
    """
    if not isinstance(task, Task):
        raise ValueError(f"{task!r} does not declare every attribute of service.tasks.Task")
    for other in _TASKS.values():
        if other.name == task.name or other.verb == task.verb:
            raise ValueError(f"task {task.name!r} (verb {task.verb!r}) clashes with registered {other.name!r}")
    _TASKS[task.name] = task
    return task


def unregister(name: str) -> None:
    """Remove a task (tests that register their own); no error when it is absent."""
    _TASKS.pop(name, None)


def get(name: str) -> Task[Any]:
    """The task registered as ``name``.

    Raises:
        KeyError: no such task; the message lists the registered ones.
    """
    try:
        return _TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; registered: {', '.join(_TASKS)}") from None


def all_tasks() -> list[Task[Any]]:
    """Every registered task, in registration order."""
    return list(_TASKS.values())


def names() -> list[str]:
    """The registered tasks' names: the values a manifest's ``task`` may take."""
    return list(_TASKS)


def verbs() -> list[str]:
    """The registered tasks' route verbs."""
    return [task.verb for task in _TASKS.values()]


def role_outputs(manifest: Manifest) -> dict[str, str]:
    """Output role -> graph output name for ``manifest``.

    The manifest's ``roles`` when it names them, else its task's roles matched to ``outputs``
    in order (the list form written before roles had names).
    """
    if manifest.roles is not None:
        return dict(manifest.roles)
    return dict(zip(get(manifest.task).roles, manifest.outputs, strict=False))


def serves(manifest: Manifest, task: Task[Any]) -> bool:
    """Whether a model with ``manifest`` serves ``task``: its own task, or a companion whose roles it names."""
    if manifest.task == task.name:
        return True
    return task.companion and set(task.roles) <= set(role_outputs(manifest))


def served_tasks(manifest: Manifest) -> list[Task[Any]]:
    """Every registered task a model with ``manifest`` serves, its own first."""
    own = get(manifest.task)
    return [own, *(t for t in _TASKS.values() if t is not own and serves(manifest, t))]


def options(manifest: Manifest) -> BaseModel:
    """The manifest's ``task_options`` as its task's ``Options`` (defaults where it names none)."""
    return get(manifest.task).Options.model_validate(manifest.task_options or {})


def output(model: ModelVersion, outcome: ImageOutcome, role: str) -> np.ndarray:
    """One image's row of the graph output that plays ``role`` (shape as the graph has it, less the batch axis)."""
    return outputs(outcome)[role_outputs(model.manifest)[role]]


def decoded(outcome: ImageOutcome) -> DecodedImage:
    """One successful image's decoded form (what :meth:`Task.fields` and :meth:`Task.picture` are given)."""
    assert outcome.image is not None
    return outcome.image


def outputs(outcome: ImageOutcome) -> dict[str, np.ndarray]:
    """One successful image's row of every graph output, by output name (less the batch axis)."""
    assert outcome.result is not None
    return outcome.result.outputs


IMAGE_SIZE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["width", "height"],
    "properties": {"width": {"type": "integer", "minimum": 1}, "height": {"type": "integer", "minimum": 1}},
    "description": "The image's size in pixels as displayed (after EXIF orientation).",
}


def result_schema(title: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one image's response: ``model``, ``version``, ``image`` and the task's ``fields``."""
    return {
        "title": title,
        "type": "object",
        "required": ["model", "version", "image", *fields],
        "properties": {
            "model": {"type": "string"},
            "version": {"type": "string"},
            "image": IMAGE_SIZE_SCHEMA,
            **fields,
        },
    }
