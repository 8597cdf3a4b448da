"""Route dependencies as ``Annotated`` aliases.

They are ``async def`` although they never await: FastAPI runs a plain ``def`` dependency in
its thread pool, a thread hop per dependency per request for a dictionary lookup.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from service.core.errors import Unavailable
from service.http.state import ServerState
from service.runtime.repository import ModelRepository


async def get_state(request: Request) -> ServerState:
    """The worker's :class:`ServerState`."""
    state: ServerState = request.app.state.server  # create_app puts it there
    return state


async def get_repository(request: Request) -> ModelRepository:
    """The loaded models.

    Raises:
        Unavailable: the models are not loaded yet (503).
    """
    state: ServerState = request.app.state.server
    if state.repository is None:  # loading, or it failed: the 503 says which
        raise Unavailable(state.startup_error or "the models are still loading", retry_after=2)
    repository: ModelRepository = state.repository
    return repository


State = Annotated[ServerState, Depends(get_state)]
Repository = Annotated[ModelRepository, Depends(get_repository)]
# ?version= of every inference route (/v1, and /v2's infer beside its /versions/{v} path)
Version = Annotated[str | None, Query(description="Model version; default: the highest", pattern=r"^[0-9]{1,9}$")]
