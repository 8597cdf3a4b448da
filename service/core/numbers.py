"""Numbers as a query string or a header spells them: no underscores.

pydantic reads a string as Python's ``int()`` and ``float()`` do, so ``?top_k=1_0`` was 10 and
``X-Request-Timeout: 1_0`` ten seconds (a tester's finding): Python's digit grouping, which no
client means in a URL. :data:`QueryInt` and :data:`QueryFloat` refuse a string with an underscore
before pydantic reads it, so the route answers 422 naming the parameter, as for ``top_k=abc``.
Use them as a field's type with its bounds in ``Field``; inside ``X | None`` with the bounds in
FastAPI's ``Query()`` the bound leaves the OpenAPI schema (``service.http.lifetime`` checks its
optional timeouts itself).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

NO_UNDERSCORE = "a number without underscores (1_0 is not read as 10)"


def plain(value: object) -> object:
    """``value`` as given, unless it is a string with an underscore.

    Raises:
        ValueError: ``"1_0"`` and the like (pydantic makes it a 422 with :data:`NO_UNDERSCORE`).
    """
    if isinstance(value, str) and "_" in value:
        raise ValueError(NO_UNDERSCORE)
    return value


QueryInt = Annotated[int, BeforeValidator(plain)]
QueryFloat = Annotated[float, BeforeValidator(plain)]
