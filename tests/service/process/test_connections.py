"""service.process.connections: the protocol's bound on pipelined requests, fed bytes directly.

A real server reads a client's bytes in chunks whose size the kernel decides; here one chunk is
handed to the protocol, so how many requests it parses, queues and answers is exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.process.connections import MAX_PIPELINED, PROTOCOL, SendTimeoutProtocol
from service.process.serve import ServeConfig

pytestmark = pytest.mark.anyio

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class Transport:
    """What uvicorn's protocol calls on an asyncio transport, recorded."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def ok(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def protocol() -> tuple[SendTimeoutProtocol, Transport]:
    from uvicorn.server import ServerState

    config = ServeConfig(ok, http=PROTOCOL, lifespan="off", log_level="warning")  # type: ignore[arg-type]
    made = SendTimeoutProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    made.connection_made(transport)  # type: ignore[arg-type]
    return made, transport


async def answered(transport: Transport, count: int) -> None:
    for _ in range(1000):  # a bound on waiting for the loop to run the requests, not a measured time
        if transport.closed or transport.written.count(b"HTTP/1.1 200") >= count:
            return
        await asyncio.sleep(0.005)


async def test_a_few_pipelined_requests_are_all_answered_on_a_connection_that_stays_open() -> None:
    made, transport = protocol()
    made.data_received(GET * 10)
    assert len(made.pipeline) == 9  # one runs, nine wait
    await answered(transport, 10)
    assert transport.written.count(b"HTTP/1.1 200") == 10
    assert not transport.closed and b"connection: close" not in transport.written.lower()


async def test_a_chunk_of_many_pipelined_requests_is_parsed_up_to_the_bound_and_the_connection_closes() -> None:
    # uvicorn parsed all 1,000 at once: 20,000 such requests held about 25 MB on one connection
    made, transport = protocol()
    made.data_received(GET * 1000)
    assert len(made.pipeline) == MAX_PIPELINED  # the rest of the chunk was never parsed
    made.data_received(GET * 1000)  # what arrives after the stop is dropped, not answered 400
    assert len(made.pipeline) == MAX_PIPELINED
    await answered(transport, MAX_PIPELINED + 1)
    responses = transport.written.split(b"HTTP/1.1 ")[1:]
    assert [r[:3] for r in responses] == [b"200"] * (MAX_PIPELINED + 1)  # no 400 for the bytes dropped
    assert b"connection: close" in responses[-1].lower()  # the last one answered says so
    assert all(b"connection: close" not in r.lower() for r in responses[:-1])
    assert transport.closed and not made.pipeline


async def test_a_malformed_request_is_still_answered_400() -> None:
    made, transport = protocol()
    made.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 400") and transport.closed
