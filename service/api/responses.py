"""Fast JSON responses (orjson)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class JSON(JSONResponse):
    """``application/json`` rendered with orjson (numpy scalars and arrays included)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
