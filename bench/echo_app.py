"""The HTTP cost alone: an endpoint that reads the same multipart body and answers a fixed small JSON.

    uvicorn bench.echo_app:app --loop uvloop --http httptools --port 8003

The benchmark's ceiling (``bench.report.ceiling``) needs the CPU seconds per request that the
HTTP machinery costs on its own, with no decoding and no model: uvicorn with uvloop and httptools
(what patchserve runs), the body received in full, the multipart parsed with python-multipart's
streaming parser (as patchserve's ``service/http/uploads.py`` does) and the image part's bytes
kept in memory, then ``{"ok": true}``. ``bench.run`` posts to it with wrk under the same load as
the contestants and divides the server process's CPU time by the requests it answered.
"""

from __future__ import annotations

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def image_bytes(content_type: str, body: bytes) -> bytes:
    """The first part of a multipart/form-data ``body``, its bytes (b"" when there is none)."""
    _, params = parse_options_header(content_type)
    chunks: list[bytes] = []
    parts = [0]

    def on_part_begin() -> None:
        parts[0] += 1

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if parts[0] == 1:
            chunks.append(data[start:end])

    parser = MultipartParser(params[b"boundary"], {"on_part_begin": on_part_begin, "on_part_data": on_part_data})
    parser.write(body)
    parser.finalize()
    return b"".join(chunks)


async def echo(request: Request) -> Response:
    data = image_bytes(request.headers["content-type"], await request.body())
    return JSONResponse({"ok": True, "bytes": len(data)})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/healthz", healthz)])
