"""The HTTP/1.1 connection's own bounds, which uvicorn lacks: unread responses, pipelining, headers.

:class:`BoundedProtocol` is uvicorn's httptools protocol with these additions (issue 15 and after):

* **A send timeout.** uvicorn writes a response into the connection's transport and, when the
  transport's buffer passes its high-water mark, waits for it to drain, with no limit: a client
  that never reads its response keeps the request's task, its in-flight slot and the unsent bytes
  on the server for as long as the connection lives (asyncio's ``close()`` itself waits for the
  buffer to drain). Once writing has been paused for ``send_timeout`` seconds without the client
  reading enough to resume it, the connection is aborted, its buffer dropped, and the request
  sees a disconnect (``ClientDisconnected``, counted as ``cancelled``).
* **Pipelining.** uvicorn answers pipelined requests one at a time but parses every request of
  each chunk it reads and queues them on the connection: one chunk of 20,000 tiny ``GET``s held
  about 25 MB. Once :data:`MAX_PIPELINED` requests wait behind the one running, the protocol stops
  parsing: the last request queued is answered with ``Connection: close``, the rest of the bytes
  are dropped unread, and the connection closes after that answer. A client must retry the
  requests it got no answer for (RFC 9112, Sec. 9.3.2); none of them reached the app.
* **Request headers, by size and by time.** httptools buffers a header of any length and uvicorn
  waits for the end of the headers without limit, so megabytes of headers, or headers trickled a
  byte a minute (slowloris), held memory and a connection for ever; so did a connection that sent
  nothing, or only blank lines (which stop uvicorn's keep-alive clock). A request whose request
  line and headers pass ``max_header_bytes`` is answered 431 (RFC 6585, Sec. 5); one whose headers
  are not complete ``header_timeout`` seconds after its first byte is answered 408 (RFC 9110, Sec.
  15.5.9); both close the connection, as nginx does with ``large_client_header_buffers`` and
  ``client_header_timeout``; a pipelined request's 431 waits for the answers before it. A new
  connection that sends no byte is closed after the keep-alive timeout, as an idle kept-alive one
  is; one that sends only blank lines, after ``header_timeout``; one whose body's tail arrives after
  its answer, after the keep-alive timeout. A request's header clock starts at its own first byte.
  The size is checked as the reads arrive (all of the read a request began in, blank lines before
  it included) and, once complete, as parsed; only a request that began in the read in which the
  one before it ended has that read counted at completion alone (where in the read it began is not
  known), so it may pass the limit by one read before its 431. A chunked body's trailer fields are
  held to the same size (httptools copies a long one whole at every read): past it the connection
  is aborted.
* **Bytes that are not HTTP/1.1.** uvicorn answered them ``400 text/plain`` at once and closed,
  so pipelined requests read whole before them got nothing. They get a problem (``{"error"}`` on
  ``/v2``) with httptools' reason, once the requests before them are answered (a queued request
  whose own chunked body broke is dropped unrun); a request line with a method token this server
  does not know is a 501 (RFC 9110, Sec. 9.1).
* **The request's head** (:mod:`service.process.request_head`): a missing (HTTP/1.1), repeated or
  invalid ``Host`` is a 400 (RFC 9112, Sec. 3.2), a ``Transfer-Encoding`` other than chunked a 501,
  in turn as above, and the connection closes.
* **Closing with unsent bytes.** A connection closed (keep-alive timeout, ``Connection: close``, a
  refusal) while its client has not read all of it is aborted after ``send_timeout``, also when
  fewer bytes than the transport's high-water mark wait, where writing never paused.

The settings are read from uvicorn's config (:class:`service.process.serve.ServeConfig`); without
them the protocol is uvicorn's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from http import HTTPStatus
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.core.errors import BadRequest, HeaderFieldsTooLarge, HeaderTimeout, NotImplementedHere, ProblemError
from service.process import request_head

log = logging.getLogger(__name__)

PROTOCOL = "service.process.connections:BoundedProtocol"  # uvicorn's ``http`` setting (importable by workers)
MAX_PIPELINED = 32  # requests a connection may queue behind the one running (each ~1.2 KB and its body)
_METHOD_LINE = re.compile(rb"(?m)^([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([^ \r\n]+) HTTP/")  # a request line's start
_PARSED = {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH"}  # never the line refused


class _StopParsing(Exception):
    """Raised in a parser callback to stop parsing a chunk (httptools has no pause)."""


class _StoppableParser:
    """httptools' request parser, for which a stop by :class:`_StopParsing` is not a bad request.

    httptools reports an exception raised in a callback as ``HttpParserCallbackError``, which
    uvicorn answers with a 400 and a warning; this wrapper swallows it when the callback stopped
    the parse on purpose, so uvicorn carries on with the requests already parsed.
    """

    def __init__(self, parser: httptools.HttpRequestParser) -> None:
        self._parser = parser
        self.error: httptools.HttpParserError | None = None  # why the bytes were not HTTP (uvicorn's 400)

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _StopParsing):
                raise
        except httptools.HttpParserError as exc:  # uvicorn answers it 400 (send_400_response), with its words
            self.error = exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a send timeout, bounds on pipelining and on request headers, and problems."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None
        self._running: Any = None  # the request cycle whose task runs now (pipelined ones wait in self.pipeline)
        self._parsing_stopped = False  # what arrives is dropped; the connection closes after its answers
        self.parser = _StoppableParser(self.parser)  # type: ignore[assignment]
        self._in_headers = False  # a request has begun and its headers are not complete
        self._header_bytes: int | None = None  # bytes of them counted so far (None: in the chunk it began)
        self._header_timer: asyncio.TimerHandle | None = None
        self._completed = False  # a request ended in the read being parsed
        self._sized = False  # the last request that ended had a Content-Length
        self._read = b""  # the read being parsed, when no request had begun before it (its request line), while parsed
        self._in_message = False  # between a request's first byte and its end (its body included)
        self._chunk_empty = False  # past a chunk's size line, no data of it yet: the last chunk's trailers come here
        self._body_in_read = False  # body data came in the read being parsed
        self._trailer_bytes = 0
        self._refusal: ProblemError | None = None  # a pipelined request's, sent once those before it are

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timeout only after a response: a connection that never sent a
        # byte was held for ever
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _in_flight(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._header_bytes, self._in_message, self._trailer_bytes = True, None, True, 0
        self._cancel_header_timer()  # a clock started by blank lines or a body's tail: this request's starts now
        if not self._in_flight():  # while one runs, reading is paused: its follower's headers wait unread
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        limit = getattr(self.config, "max_header_bytes", None)
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)  # ": " and CRLF
        if limit and size > limit:  # (whole in one read: the reads' count never saw it incomplete)
            self._too_large(limit)
            raise _StopParsing  # before uvicorn makes it a request; _StoppableParser swallows it
        refused = request_head.refusal(self.headers, self.parser.get_http_version())  # Host, Transfer-Encoding
        if refused is not None:
            log.info("client %s sent a request refused %d: %s", self.client, refused.status, refused.detail)
            self._refuse_in_turn(refused)
            raise _StopParsing
        super().on_headers_complete()

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_headers and self._in_message:  # a chunked body's trailer field
            self._count_trailers(len(name) + len(value) + 4)
            if self._parsing_stopped:
                raise _StopParsing  # the rest of the read is not parsed
        super().on_header(name, value)

    def _count_trailers(self, size: int) -> None:
        """Count ``size`` more bytes of trailers; past ``max_header_bytes``, abort the connection."""
        self._trailer_bytes += size
        limit = getattr(self.config, "max_header_bytes", None)
        if limit and self._trailer_bytes > limit:
            log.info("client %s sent chunked trailers over %d bytes; connection aborted", self.client, limit)
            self._parsing_stopped = True
            self.transport.abort()  # its request sees a disconnect; an answer given already was sent

    def on_chunk_header(self) -> None:  # (httptools calls these when the protocol has them)
        self._chunk_empty = True

    def on_chunk_complete(self) -> None:
        self._chunk_empty = False

    def on_body(self, body: bytes) -> None:
        self._chunk_empty, self._body_in_read = False, True
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():  # (Connection: close) asyncio's close waits for the buffer to drain
            self._abort_if_unsent()
            return
        if self._in_flight():
            return
        if self._refusal is not None:  # every request before the refused one is answered
            self._refuse(self._refusal)
        elif self._in_headers:  # reading resumes: the follower's clock starts
            self._arm_header_timer()

    def timeout_keep_alive_handler(self) -> None:
        super().timeout_keep_alive_handler()
        self._abort_if_unsent()

    def _abort_if_unsent(self) -> None:
        """Arm the send timeout on a closing connection that still holds unsent bytes.

        A client that stops reading can fill the kernel's buffers while less than uvloop's high-water
        mark waits in the transport: writing never pauses, so the send timeout never starts, and the
        close waits for the client for ever (a fresh user's; 3 MB held for as long as it stayed).
        """
        timeout = getattr(self.config, "send_timeout", None)
        if timeout and self._send_timer is None and self.transport.get_write_buffer_size():
            self._send_timer = self.loop.call_later(timeout, self._abort_unread, timeout)

    def _arm_header_timer(self, timeout: float | None = None) -> None:
        timeout = timeout or getattr(self.config, "header_timeout", None)
        if timeout and self._header_timer is None:
            self._header_timer = self.loop.call_later(timeout, self._headers_too_slow, timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self, timeout: float) -> None:
        self._header_timer = None
        if self._in_flight() or self.transport.is_closing():
            return
        if not self._in_headers:  # blank lines only (RFC 9112 Sec. 2.2 lets them come before a request)
            self.transport.close()
            self._abort_if_unsent()
            return
        log.info(
            "client %s sent no complete request headers in %.1f s (PATCHSERVE_HEADER_TIMEOUT)", self.client, timeout
        )
        self._refuse(HeaderTimeout(f"the request's headers did not arrive within {timeout:g} s"))

    def _refuse(self, problem: ProblemError) -> None:
        """Answer the request whose headers are arriving with ``problem`` and close (nothing else is in flight)."""
        self._parsing_stopped = True
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        rid = uuid.uuid4().hex  # a new request id, as every response carries one (the request's own is unread)
        log.info("client %s answered %d, request id %s", self.client, problem.status, rid)  # (after the reason's line)
        if self.url.startswith(b"/v2"):
            body, media = json.dumps({"error": problem.detail}).encode(), b"application/json"
        else:
            body, media = json.dumps(problem.to_problem(rid)).encode(), b"application/problem+json"
        head = [b"HTTP/1.1 %d %s\r\n" % (problem.status, HTTPStatus(problem.status).phrase.encode())]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [
            b"x-request-id: " + rid.encode() + b"\r\n",
            b"content-type: " + media + b"\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        self._abort_if_unsent()

    def send_400_response(self, msg: str) -> None:
        """Bytes httptools cannot parse: a problem (uvicorn wrote plain text), after the requests before them.

        Requests read whole before the malformed bytes are answered first, as before a 431 (uvicorn
        answered the 400 at once and closed: the requests before it got nothing); a queued request
        whose own body is what broke is dropped unrun (run, it would wait for a body that never
        comes). A request line of a method token this server does not know (``FOO / HTTP/1.1``) is a
        501 (RFC 9110, Sec. 9.1); other bytes (a TLS handshake, binary) are a 400.
        """
        refusal = self._parse_refusal(msg)
        cycle = self.cycle
        if cycle is not None and cycle.more_body and cycle is not self._running:  # queued, its body broken
            self.pipeline = type(self.pipeline)(entry for entry in self.pipeline if entry[0] is not cycle)
            self.cycle = self.pipeline[0][0] if self.pipeline else self._running  # (appendleft: [0] is the last)
        if self._in_flight() and not self.cycle.more_body:  # a complete request runs, or waits its turn
            self._parsing_stopped, self._refusal = True, refusal
        else:
            self._refuse(refusal)

    def _parse_refusal(self, msg: str) -> ProblemError:
        """The 400 (or 501) of the read httptools refused, with its reason; ``msg`` is uvicorn's words.

        The request line refused is the read's last line shaped like one whose method is not one
        httptools parses (``FOO / HTTP/1.1``, ``get``, ``CONNECT host:443``): a 501, its target
        choosing the ``/v2`` error format. Bytes with no such line (a TLS handshake) are a 400.
        """
        error = getattr(self.parser, "error", None)
        reason = str(error).rstrip(".").lower() if error is not None else "a request line or header cannot be read"
        if "pri/upgrade" in reason:  # "PRI * HTTP/2.0": HTTP/2 with prior knowledge
            reason = "it begins as HTTP/2 does (this port speaks HTTP/1.1)"
        log.info("client %s sent a request that is not valid HTTP/1.1: %s", self.client, reason)
        lines = [line for line in _METHOD_LINE.finditer(self._read) if line[1] not in _PARSED]
        method = isinstance(error, httptools.HttpParserInvalidMethodError)
        if lines and (method or lines[-1][1] == b"CONNECT"):
            token, target = lines[-1][1], lines[-1][2]
            if target.startswith(b"/v2"):
                self.url = target  # (_refuse writes /v2's errors as /v2 does)
            if token == b"CONNECT":
                return NotImplementedHere("CONNECT is for proxies, and this server is not one (RFC 9110, Sec. 9.3.6)")
            shown = token[:40].decode("latin-1")
            return NotImplementedHere(f"the method {shown!r} is not one this server knows (RFC 9110, Sec. 9)")
        overrun = (  # bytes after a request with a Content-Length did not begin a request: its body ran past it?
            "; if the request before it sent more body than its Content-Length said, the rest was read as a request"
            if method and self._sized
            else ""
        )
        return BadRequest(f"the request is not valid HTTP/1.1: {reason} (RFC 9112){overrun}")

    def _too_large(self, limit: int) -> None:
        """Refuse the request whose headers pass ``limit`` bytes: 431 now, or once those before it are answered."""
        log.info("client %s sent request headers over %d bytes (PATCHSERVE_MAX_HEADER_BYTES)", self.client, limit)
        self._refuse_in_turn(HeaderFieldsTooLarge(f"the request's headers pass {limit} bytes"))

    def _refuse_in_turn(self, refusal: ProblemError) -> None:
        """Refuse the request whose headers are complete: now, or once those before it are answered."""
        if self._in_flight():  # a pipelined request's
            self._parsing_stopped, self._refusal = True, refusal
        else:
            self._refuse(refusal)

    def data_received(self, data: bytes) -> None:
        if self._parsing_stopped:
            return  # dropped unparsed: the connection closes once the requests it queued are answered
        self._read = b"" if self._in_message else data  # between requests: a request line may begin it (this call only)
        counting = self._in_headers and self._header_bytes is not None
        trailing = self._chunk_empty  # the read starts among the last chunk's trailers, or before a chunk's data
        self._completed = self._body_in_read = False
        super().data_received(data)
        self._read = b""  # not kept: an idle connection would hold its last read
        if self._parsing_stopped or self.transport.is_closing():
            return
        limit = getattr(self.config, "max_header_bytes", None)
        if trailing and self._chunk_empty and not self._body_in_read:  # trailer fields: no chunk data came
            self._count_trailers(len(data))  # (httptools copies a long one whole at every read)
            if self._parsing_stopped:
                return
        if not self._in_headers:
            if not self._in_flight():  # blank lines (header clock), or a body's tail after its answer (keep-alive)
                self._arm_header_timer(self.timeout_keep_alive if self._in_message or self._completed else None)
            return
        if counting and self._header_bytes is not None:  # the request began in an earlier read
            self._header_bytes += len(data)
        else:  # it began in this one, which held nothing else but blank lines, unless a request ended in it
            self._header_bytes = 0 if self._completed else len(data)
        if limit and self._header_bytes > limit:
            self._too_large(limit)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._completed, self._in_message, self._chunk_empty = True, False, False
        self._sized = any(name == b"content-length" for name, _ in self.headers)  # (uvicorn's names: lower case)
        if len(self.pipeline) >= MAX_PIPELINED and not self._parsing_stopped:
            self._parsing_stopped = True
            self.cycle.keep_alive = False  # the request just queued is the last answered: Connection: close
            log.info(
                "client %s pipelined more than %d requests: the connection closes after answering them",
                self.client,
                MAX_PIPELINED,
            )
            raise _StopParsing  # stops httptools in the middle of the chunk; _StoppableParser swallows it

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def pause_writing(self) -> None:
        super().pause_writing()
        timeout = getattr(self.config, "send_timeout", None)
        if timeout and self._send_timer is None:
            self._send_timer = self.loop.call_later(timeout, self._abort_unread, timeout)

    def resume_writing(self) -> None:
        self._cancel_send_timer()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_send_timer()
        self._cancel_header_timer()
        running = self._running
        if running is not None and not running.response_complete:
            # uvicorn marks only the last request parsed as disconnected: with pipelined requests the
            # one running would write to the closed transport (a RuntimeError, three ERROR tracebacks)
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)

    def _abort_unread(self, timeout: float) -> None:
        self._send_timer = None
        unsent = self.transport.get_write_buffer_size()
        log.warning(
            "client %s read nothing of its response for %.1f s (PATCHSERVE_SEND_TIMEOUT); connection aborted, "
            "%d unsent bytes dropped",
            self.client,
            timeout,
            unsent,
        )
        self.transport.abort()
