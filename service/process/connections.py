"""Connections whose client does not read: a send timeout, which uvicorn lacks (issue 15).

uvicorn writes a response into the connection's transport and, when the transport's buffer
passes its high-water mark, waits for it to drain, with no limit: a client that never reads
its response keeps the request's task, its in-flight slot and the unsent bytes on the server
for as long as the connection lives (asyncio's ``close()`` itself waits for the buffer to
drain). :class:`SendTimeoutProtocol` is uvicorn's httptools protocol with one addition: once
writing has been paused (the buffer is full) for ``send_timeout`` seconds without the client
reading enough to resume it, the connection is aborted, its buffer dropped, and the request
sees a disconnect (``ClientDisconnected``, counted as ``cancelled``).

It also bounds **pipelining**. uvicorn answers pipelined requests one at a time but parses every
request of each chunk it reads and queues them on the connection: one chunk of 20,000 tiny
``GET``s held about 25 MB. Once :data:`MAX_PIPELINED` requests wait behind the one running, the
protocol stops parsing: the last request queued is answered with ``Connection: close``, the rest
of the bytes are dropped unread, and the connection closes after that answer. A client must retry
the requests it got no answer for (RFC 9112, Sec. 9.3.2); none of them reached the app.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

PROTOCOL = "service.process.connections:SendTimeoutProtocol"  # uvicorn's ``http`` setting (importable by workers)
MAX_PIPELINED = 32  # requests a connection may queue behind the one running (each ~1.2 KB and its body)


class _PipelineFull(Exception):
    """Raised in a parser callback to stop parsing a chunk (httptools has no pause)."""


class _StoppableParser:
    """httptools' request parser, for which a stop by :class:`_PipelineFull` is not a bad request.

    httptools reports an exception raised in a callback as ``HttpParserCallbackError``, which
    uvicorn answers with a 400 and a warning; this wrapper swallows it when the callback stopped
    the parse on purpose, so uvicorn carries on with the requests already parsed.
    """

    def __init__(self, parser: httptools.HttpRequestParser) -> None:
        self._parser = parser

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _PipelineFull):
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class SendTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, aborting a connection whose writes stay paused ``send_timeout`` s.

    ``send_timeout`` (seconds) is read from uvicorn's config (:class:`service.process.serve.ServeConfig`);
    without it the protocol is uvicorn's own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None
        self._running: Any = None  # the request cycle whose task runs now (pipelined ones wait in self.pipeline)
        self._parsing_stopped = False  # MAX_PIPELINED reached: what arrives is dropped, the connection closes
        self.parser = _StoppableParser(self.parser)  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._parsing_stopped:
            return  # dropped unparsed: the connection closes once the requests it queued are answered
        super().data_received(data)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if len(self.pipeline) >= MAX_PIPELINED and not self._parsing_stopped:
            self._parsing_stopped = True
            self.cycle.keep_alive = False  # the request just queued is the last answered: Connection: close
            log.info(
                "client %s pipelined more than %d requests: the connection closes after answering them",
                self.client,
                MAX_PIPELINED,
            )
            raise _PipelineFull  # stops httptools in the middle of the chunk; _StoppableParser swallows it

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
