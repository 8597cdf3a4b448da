"""Route dependencies as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.errors import Unavailable
from service.repository import ModelRepository
from service.state import ServerState


def get_state(request: Request) -> ServerState:
    """The worker's :class:`ServerState`."""
    return request.app.state.server


def get_repository(request: Request) -> ModelRepository:
    """The loaded models.

    Raises:
        Unavailable: the models are not loaded yet (503).
    """
    repository = get_state(request).repository
    if repository is None:
        raise Unavailable("the models are still loading", retry_after=2)
    return repository


State = Annotated[ServerState, Depends(get_state)]
Repository = Annotated[ModelRepository, Depends(get_repository)]
