"""service.process.connections: the protocol's bounds on pipelining and request headers, fed bytes directly.

A real server reads a client's bytes in chunks whose size the kernel decides; here one chunk is
handed to the protocol, so how many requests it parses, queues and answers is exact.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from service.process.connections import MAX_PIPELINED, PROTOCOL, BoundedProtocol
from service.process.serve import ServeConfig

pytestmark = pytest.mark.anyio

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


class Transport:
    """What uvicorn's protocol calls on an asyncio transport, recorded."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = self.aborted = False
        self.unsent = 0  # what get_write_buffer_size says: bytes the client has not taken

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
        return self.unsent

    def abort(self) -> None:
        self.closed = self.aborted = True


async def ok(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def gated(made: BoundedProtocol) -> asyncio.Event:
    """Make ``made``'s app answer only once the returned event is set (a request held in flight)."""
    gate = asyncio.Event()

    async def slow(scope: dict, receive: Any, send: Any) -> None:
        await gate.wait()
        await ok(scope, receive, send)

    made.app = slow
    return gate


def protocol(**settings: Any) -> tuple[BoundedProtocol, Transport]:
    from uvicorn.server import ServerState

    config = ServeConfig(ok, http=PROTOCOL, lifespan="off", log_level="warning", **settings)  # type: ignore[arg-type]
    made = BoundedProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    made.connection_made(transport)  # type: ignore[arg-type]
    return made, transport


async def answered(transport: Transport, count: int) -> None:
    for _ in range(1000):  # a bound on waiting for the loop to run the requests, not a measured time
        if transport.closed or transport.written.count(b"HTTP/1.1 200") >= count:
            return
        await asyncio.sleep(0.005)


async def aborted(transport: Transport) -> None:
    for _ in range(1000):  # a bound on waiting for the send timeout, not a measured time
        if transport.aborted:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the connection was not aborted")


async def closed(transport: Transport) -> None:
    for _ in range(1000):  # a bound on waiting for the protocol's timer, not a measured time
        if transport.closed:
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


def problems(transport: Transport) -> list[tuple[int, str, dict]]:
    """Each response written: its status, its content type and its JSON body (``{}`` when not JSON)."""
    answers = []
    for response in re.split(rb"HTTP/1\.1 (?=\d{3} )", transport.written)[1:]:  # (a detail may say "HTTP/1.1 ")
        head, _, body = response.partition(b"\r\n\r\n")
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        media = fields.get(b"content-type", b"").decode()
        answers.append((int(head[:3]), media, json.loads(body) if "json" in media else {}))
    return answers


@pytest.mark.parametrize(
    ("request_bytes", "status", "detail"),
    [
        (b"FOO /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 501, "the method 'FOO' is not one this server knows"),
        (b"get /healthz HTTP/1.1\r\n\r\n", 501, "the method 'get' is not one"),  # methods are case-sensitive
        (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 501, "CONNECT is for proxies"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "not valid HTTP/1.1: invalid method encountered"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "invalid method encountered"),  # TLS: not a 5xx
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "it begins as HTTP/2 does"),
        (b"GET http://[ HTTP/1.1\r\nHost: x\r\n\r\n", 400, "a request line or header cannot be read"),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "decodes chunked alone"),
        (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400, "not valid HTTP/1.1: invalid header token"),
        (b"GET /a\x00b HTTP/1.1\r\n\r\n", 400, "not valid HTTP/1.1: invalid char in url path"),
        (b"POST /v2/models/m/infer HTTP/1.1\r\nHost x\r\n\r\n", 400, "invalid header token"),  # /v2: {"error"}
        (b"FOO /v2/health/live HTTP/1.1\r\n\r\n", 501, "'FOO'"),  # a tester's: its URL is not parsed yet
        # RFC 9112, Sec. 3.2: a missing, repeated or invalid Host is a 400 (uvicorn served them; a tester's)
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "an HTTP/1.1 request needs a Host header"),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "the request has 2 Host headers"),
        (b"GET /healthz HTTP/1.1\r\nHost: a b/c@@\r\n\r\n", 400, "the Host header 'a b/c@@' is not a host[:port]"),
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x:y\r\n\r\n", 400, "is not a host[:port]"),  # /v2: {"error"}
        # which refusal comes first: an unknown method's (the parser's), then Transfer-Encoding, then Host,
        # then CONNECT's (httptools stops at its headers' end: a Host-less CONNECT hears of its Host)
        (b"FOO /healthz HTTP/1.1\r\n\r\n", 501, "the method 'FOO' is not one"),
        (b"CONNECT example.com:443 HTTP/1.1\r\n\r\n", 400, "an HTTP/1.1 request needs a Host header"),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "decodes chunked alone"),
        (b"GET /healthz HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "the request has 2 Host headers"),
    ],
)
async def test_a_malformed_request_is_answered_with_a_problem_and_the_connection_closes(
    request_bytes: bytes, status: int, detail: str
) -> None:
    # uvicorn answered these "400 text/plain Invalid HTTP request received." (a tester's finding)
    made, transport = protocol()
    made.data_received(request_bytes)
    [(answered, media, body)] = problems(transport)
    v2 = b" /v2/" in request_bytes
    assert (answered, media) == (status, "application/json" if v2 else "application/problem+json")
    assert detail in (body["error"] if v2 else body["detail"]) and transport.closed
    assert transport.written.count(b"\r\nx-request-id: ") == 1


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.0\r\n\r\n",  # HTTP/1.0 may leave Host out
        b"GET /healthz HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n",  # an IP literal and a port
        b"GET /healthz HTTP/1.1\r\nHost: [fe80::1%25en0]:8000\r\n\r\n",  # a zone id a client left in
        b"GET /healthz HTTP/1.1\r\nHost: Example.COM.\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: my-svc.ns.svc.cluster.local:80\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost:\r\n\r\n",  # empty: a target without an authority (RFC 9112, Sec. 3.2)
    ],
)
async def test_a_request_with_a_valid_host_or_none_in_http_1_0_is_served(request_bytes: bytes) -> None:
    made, transport = protocol()
    made.data_received(request_bytes)
    await answered(transport, 1)
    assert transport.written.startswith(b"HTTP/1.1 200 ")


async def test_pipelined_requests_before_a_malformed_one_are_answered_first() -> None:
    # uvicorn answered the 400 at once and closed: the two valid requests read before it got nothing
    made, transport = protocol()
    gate = gated(made)
    made.data_received(GET + GET + b"GARBAGE\r\n\r\n")
    assert transport.written == b"" and not transport.closed  # the first is still running
    gate.set()
    await closed(transport)
    assert [(status, problem.get("status")) for status, _, problem in problems(transport)] == [
        (200, None),
        (200, None),
        (400, 400),  # no line shaped as a request's: bytes, not an unknown method
    ]
    assert "Content-Length" not in problems(transport)[-1][2]["detail"]  # no body before it ran long
    made, transport = protocol()
    made.data_received(GET + b"FOO / HTTP/1.1\r\n\r\n")  # a request line after a request, in one read
    await closed(transport)
    assert [(status, problem.get("status")) for status, _, problem in problems(transport)] == [(200, None), (501, 501)]


async def test_a_body_longer_than_its_content_length_answers_the_request_then_says_so() -> None:
    made, transport = protocol()
    made.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n12345\x89PNG\r\n\x1a\n more bytes")
    await closed(transport)
    [(first, _, _), (second, _, problem)] = problems(transport)
    assert (first, second) == (200, 400) and "more body than its Content-Length said" in problem["detail"]


async def test_the_content_length_hint_goes_with_bytes_after_a_sized_body_only() -> None:
    # A tester's: the hint came with a chunked request's own broken chunk after a sized POST, and not
    # when the extra bytes of a body came in a later read.
    sized = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n12345"
    hint = "more body than its Content-Length said"
    made, transport = protocol()
    made.data_received(sized)
    await answered(transport, 1)
    made.data_received(b"\x89PNG\r\n\x1a\n more bytes")  # the body's tail, a read later
    await closed(transport)
    assert hint in problems(transport)[-1][2]["detail"]
    made, transport = protocol()
    made.data_received(sized + b"POST /y HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nXYZ\r\n")
    await closed(transport)
    [(first, _, _), (second, _, problem)] = problems(transport)
    assert (first, second) == (200, 400) and hint not in problem["detail"]


async def test_a_queued_request_with_a_broken_body_is_dropped_and_the_one_before_it_answered() -> None:
    # A reviewer's: GET + a chunked POST whose chunk is broken, in one read, got only the 400: the
    # check looked at the last request parsed (the POST, body unfinished) and refused at once.
    made, transport = protocol()
    gate = gated(made)
    made.data_received(GET + b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n")
    assert transport.written == b"" and not made.pipeline  # the GET runs; the POST will never run
    gate.set()
    await closed(transport)
    assert [status for status, _, _ in problems(transport)] == [200, 400]


async def test_a_malformed_chunked_body_is_refused_at_once_not_after_its_request() -> None:
    # its request cannot end (its body is broken): waiting for its answer would wait for ever
    made, transport = protocol()
    gated(made)  # never set: the request's answer would never come
    made.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n")
    [(status, _, problem)] = problems(transport)
    assert status == 400 and "not valid HTTP/1.1" in problem["detail"] and transport.closed


async def test_headers_past_the_limit_are_answered_431_and_the_connection_closes(caplog) -> None:
    caplog.set_level("INFO", logger="service.process.connections")
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: ")  # the read the request began in
    for _ in range(3):
        made.data_received(b"a" * 1000)  # 3,000 bytes of one header value since
    assert transport.written.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n") and transport.closed
    assert b"content-type: application/problem+json" in transport.written
    problem = json.loads(transport.written.split(b"\r\n\r\n", 1)[1])
    assert problem["type"] == "urn:patchserve:problem:request-header-fields-too-large" and problem["status"] == 431
    # a tester's: "every response carries X-Request-ID", and a problem names it as its instance
    (rid,) = re.findall(rb"\r\nx-request-id: ([0-9a-f]{32})\r\n", transport.written)
    assert problem["instance"] == rid.decode()
    assert f"answered 431, request id {rid.decode()}" in caplog.text  # so that a quoted id can be found
    made.data_received(b"\r\n\r\n")  # dropped: nothing more is answered
    assert transport.written.count(b"HTTP/1.1") == 1


async def test_headers_under_the_limit_in_many_reads_are_served() -> None:
    made, transport = protocol(max_header_bytes=2048)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 1500 + b"\r\n\r\n"
    for i in range(0, len(request), 100):
        made.data_received(request[i : i + 100])
    await answered(transport, 1)
    assert transport.written.startswith(b"HTTP/1.1 200") and not transport.closed


async def test_a_v2_request_with_too_large_headers_gets_its_error_as_v2_writes_them() -> None:
    made, transport = protocol(max_header_bytes=1024)
    made.data_received(b"POST /v2/models/m/infer HTTP/1.1\r\nX-Long: ")
    made.data_received(b"a" * 2000)
    assert transport.written.startswith(b"HTTP/1.1 431") and b'{"error": ' in transport.written


async def test_headers_that_trickle_past_the_header_timeout_are_answered_408() -> None:
    made, transport = protocol(header_timeout=0.05)
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line (slowloris)
    await closed(transport)
    assert transport.written.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"connection: close" in transport.written


async def test_the_header_timeout_does_not_run_while_a_request_before_it_is_in_flight() -> None:
    # while one request runs uvicorn reads no more, so the next one's headers may wait unread
    made, transport = protocol(header_timeout=0.05)
    gate = gated(made)
    made.data_received(GET + b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the second one's headers unfinished
    await asyncio.sleep(0.2)  # four header timeouts pass while the first runs
    assert not transport.closed and transport.written == b""
    gate.set()
    await answered(transport, 1)
    await closed(transport)  # its own clock starts once the first is answered
    assert transport.written.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in transport.written


async def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive_timeout() -> None:
    _, transport = protocol(timeout_keep_alive=0.05)
    await closed(transport)
    assert transport.closed and transport.written == b""


async def test_headers_past_the_limit_in_the_read_that_began_the_request_are_refused_at_once() -> None:
    # A fresh user's: the first read was never counted, so a 100 KB header in one read passed an 8 KiB limit
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000)
    assert transport.written.startswith(b"HTTP/1.1 431") and transport.closed


async def test_blank_lines_alone_do_not_hold_a_connection() -> None:
    # A fresh user's: one CRLF stopped uvicorn's keep-alive clock and started no header clock: held for ever
    idle, transport = protocol(header_timeout=0.05)
    idle.data_received(b"\r\n")
    await closed(transport)
    assert transport.closed and transport.written == b""
    made, transport = protocol(header_timeout=0.05)
    made.data_received(GET)
    await answered(transport, 1)
    made.data_received(b"\r\n")  # after an answer, on the kept-alive connection
    await closed(transport)
    assert transport.closed and transport.written.count(b"HTTP/1.1") == 1


async def test_a_pipelined_request_with_too_large_headers_is_answered_431_after_those_before_it() -> None:
    made, transport = protocol(max_header_bytes=2048)
    gate = gated(made)
    made.data_received(GET + b"GET /healthz HTTP/1.1\r\nX-Big: ")  # the second begins in the first's read
    made.data_received(b"a" * 3000)
    assert transport.written == b"" and not transport.closed  # the first is still running
    gate.set()
    await closed(transport)
    responses = transport.written.split(b"HTTP/1.1 ")[1:]
    assert [r[:3] for r in responses] == [b"200", b"431"]


async def test_headers_past_the_limit_that_arrive_whole_in_one_read_are_refused() -> None:
    # The third fresh user's: a 10 KB header in one read passed a 4 KiB limit (no read saw it incomplete)
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 431") and transport.closed
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"GET /healthz HTTP/1.1\r\n" + b"a: b\r\n" * 400 + b"\r\n")  # many small ones
    assert transport.written.startswith(b"HTTP/1.1 431")
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 1900 + b"\r\n\r\n")
    await answered(transport, 1)
    assert transport.written.startswith(b"HTTP/1.1 200")


async def test_chunked_trailers_past_the_header_limit_close_the_connection() -> None:
    # The third fresh user's: trailers were counted by nothing; 4 s of them took 1 GB
    made, transport = protocol(max_header_bytes=2048)
    gate = gated(made)  # the request stays in flight while its trailers arrive
    made.data_received(b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n")
    for _ in range(3):
        made.data_received(b"a: b\r\n" * 200)  # 1,200 bytes a read
    assert transport.aborted
    gate.set()
    # a chunked body in many reads, its chunks' size lines among them, is not trailers
    made, transport = protocol(max_header_bytes=2048)
    made.data_received(b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(100):
        made.data_received(b"400\r\n")
        made.data_received(b"x" * 1024 + b"\r\n")
    made.data_received(b"0\r\nX-Trailer: 1\r\n\r\n")
    await answered(transport, 1)
    assert not transport.aborted and transport.written.startswith(b"HTTP/1.1 ")


async def test_the_header_clock_starts_at_the_requests_first_byte_not_at_blank_lines_before_it() -> None:
    made, _ = protocol(header_timeout=10.0)
    made.data_received(b"\r\n")
    started = made._header_timer
    assert started is not None
    await asyncio.sleep(0.01)
    made.data_received(b"GET /healthz HTTP/1.1\r\n")
    assert made._header_timer is not started and made._header_timer is not None
    assert made._header_timer.when() > started.when()


async def test_a_bodys_tail_after_an_early_answer_gets_the_keep_alive_timeout_not_the_header_one() -> None:
    made, transport = protocol(header_timeout=1.0, timeout_keep_alive=100)
    made.data_received(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
    await answered(transport, 1)  # answered before its body is read
    made.data_received(b"0123456789")
    assert made._header_timer is not None
    assert made._header_timer.when() - asyncio.get_running_loop().time() > 50


async def test_a_closing_connection_with_unsent_bytes_is_aborted_after_the_send_timeout() -> None:
    # The third fresh user's: with the kernel's buffers full and less than the high-water mark in
    # uvloop's, writing never paused, so no send timeout ran, and the close waited for ever
    made, transport = protocol(send_timeout=0.05)
    transport.unsent = 1000
    made.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await answered(transport, 1)
    await closed(transport)
    await aborted(transport)
    # the same when blank lines after an answer close the connection
    made, transport = protocol(send_timeout=0.05, header_timeout=0.05)
    made.data_received(GET)
    await answered(transport, 1)
    transport.unsent = 1000
    made.data_received(b"\r\n")
    await closed(transport)
    await aborted(transport)
