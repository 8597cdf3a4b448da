"""OpenTelemetry traces of every request and every batch, exported over OTLP/HTTP; optional.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set and
``OTEL_SDK_DISABLED`` is not ``true``, with the ``otel`` extra installed
(``pip install 'patchserve[otel]'``). Everything else comes from the standard ``OTEL_*``
variables that the SDK reads itself: ``OTEL_SERVICE_NAME`` (default here ``patchserve``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``_ARG`` (default: parent-based, always
on), ``OTEL_PROPAGATORS`` (default: W3C ``traceparent`` and baggage), the exporter's
``OTEL_EXPORTER_OTLP_*`` headers, timeout and compression, and the batch processor's
``OTEL_BSP_*``. Off, this module imports no ``opentelemetry`` module and every hook below is a
test of one global.

What is traced:

* **a request**: a ``SERVER`` span named ``{method} {route}``, continuing the caller's trace
  when it sent a ``traceparent``; attributes ``http.request.method``, ``url.path``,
  ``http.route``, ``http.response.status_code``, ``patchserve.request_id`` and the model and
  version it named. Its children: ``read body`` (first to last byte received), ``decode``
  (decode + preprocess of one image, in the pool), ``queue`` (from queued to its batch's start)
  and ``compute`` (its batch's run), one of each per image.
* **a batch run**: a span of its own trace (one batch serves many traces, so a link, not a
  parent), **linked** to the span of every request it served; attributes
  ``patchserve.batch.size``, ``patchserve.batch.reason`` (``size``, ``delay``, ``idle``: why it
  left the queue), ``patchserve.model`` and ``patchserve.model.version``. Each request's
  ``compute`` span links back to it.

Spans are handed to a ``BatchSpanProcessor``, which exports them from its own thread in
batches: the request path only creates and ends spans. Probes and scrapes are not traced.

The call sites hold small hooks (:func:`decoding`, :func:`queued`, :func:`batch_started`,
:func:`batch_ended`) and the app factory installs
:class:`service.http.middleware.tracing.TracingMiddleware`; what a hook does lives here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.types import Scope

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import Getter

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
DEFAULT_SERVICE_NAME = "patchserve"
_NO_SPAN = contextlib.nullcontext()


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for traces: an OTLP endpoint is set and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


@dataclass(frozen=True)
class Ticket:
    """What a queued input carries so its batch can trace it.

    Attributes:
        context: the OpenTelemetry context of the request (its span is the parent of the
            ``queue`` and ``compute`` spans).
        span_context: the request span's ``SpanContext`` (what the batch span links to).
        enqueued_ns: when it was queued, ns since the epoch.
    """

    context: Any
    span_context: Any
    enqueued_ns: int


@dataclass
class BatchTrace:
    """A batch run being traced: its span, the tickets of its traced inputs, its size and start (ns)."""

    span: Any
    tickets: list[Ticket]
    size: int
    started_ns: int


class Tracer:
    """Creates patchserve's spans with an OpenTelemetry SDK ``TracerProvider``.

    Args:
        provider: the provider (with its span processors and exporter); :meth:`shutdown` shuts
            it down, flushing what is still buffered.
    """

    def __init__(self, provider: Any) -> None:
        from opentelemetry import propagate

        self.provider = provider
        self._tracer = provider.get_tracer("patchserve")
        self._propagator = propagate.get_global_textmap()
        self._headers = _asgi_headers()

    # A request: the server span and its children.

    def start_request(self, scope: Scope) -> tuple[Any, Any]:
        """Start the server span of an HTTP request; returns (span, its context), not attached."""
        from opentelemetry import trace

        parent = self._propagator.extract(scope["headers"], getter=self._headers)
        method = scope["method"]
        span = self._tracer.start_span(
            method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"], "url.scheme": scope["scheme"]},
        )
        return span, trace.set_span_in_context(span, parent)

    def finish_request(self, span: Any, scope: Scope, status: int | None, error: BaseException | None) -> None:
        """End the server span: name it by its route and add what the layers below left in ``scope``."""
        from opentelemetry.trace import Status, StatusCode

        template = getattr(scope.get("route"), "path", None)
        if template:
            span.update_name(f"{scope['method']} {template}")
            span.set_attribute("http.route", template)
        state = scope.get("state", {})
        for key, attribute in (("request_id", "patchserve.request_id"), ("model", "patchserve.model")):
            if state.get(key) is not None:
                span.set_attribute(attribute, str(state[key]))
        if state.get("version"):
            span.set_attribute("patchserve.model.version", str(state["version"]))
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None:
            span.record_exception(error)
        if error is not None or (status is not None and status >= 500):
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def record(self, name: str, context: Any, start_ns: int, end_ns: int, links: Sequence[Any] = ()) -> Any:
        """A finished child span of ``context`` from ``start_ns`` to ``end_ns``."""
        span = self._tracer.start_span(name, context=context, start_time=start_ns, links=links)
        span.end(end_time=end_ns)
        return span

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[Any]:
        """A child span of the current one around a block (errors recorded)."""
        with self._tracer.start_as_current_span(name) as span:
            yield span

    # A batch: its own span, linked to the requests it runs.

    def ticket(self) -> Ticket | None:
        """The current request's :class:`Ticket`, or None outside a traced request."""
        from opentelemetry import context, trace

        current = context.get_current()
        span_context = trace.get_current_span(current).get_span_context()
        if not span_context.is_valid:
            return None
        return Ticket(current, span_context, time.time_ns())

    def start_batch(self, model: str, version: str, reason: str, tickets: Sequence[Ticket | None]) -> BatchTrace:
        """Start a batch's span, linked to every traced request in it, and end their ``queue`` spans.

        Args:
            tickets: one per input of the batch (None for an input queued outside a traced request).
        """
        from opentelemetry import context, trace

        now = time.time_ns()
        traced = [t for t in tickets if t is not None]
        span = self._tracer.start_span(
            "batch",
            context=context.Context(),  # a root: the batch belongs to no one request's trace
            kind=trace.SpanKind.INTERNAL,
            links=[trace.Link(t.span_context) for t in traced],
            start_time=now,
            attributes={
                "patchserve.model": model,
                "patchserve.model.version": version,
                "patchserve.batch.size": len(tickets),
                "patchserve.batch.reason": reason,
            },
        )
        for t in traced:
            self.record("queue", t.context, t.enqueued_ns, now)
        return BatchTrace(span, traced, len(tickets), now)

    def end_batch(self, batch: BatchTrace, error: BaseException | None) -> None:
        """End a batch's span and give each of its requests a ``compute`` span linked to it."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        now = time.time_ns()
        link = [trace.Link(batch.span.get_span_context())]
        for t in batch.tickets:
            compute = self._tracer.start_span(
                "compute",
                context=t.context,
                start_time=batch.started_ns,
                links=link,
                attributes={"patchserve.batch.size": batch.size},
            )
            if error is not None:
                compute.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            compute.end(end_time=now)
        if error is not None:
            batch.span.record_exception(error)
            batch.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        batch.span.end(end_time=now)

    def shutdown(self) -> None:
        """Flush and stop the provider (blocking: the exporter may send one last batch)."""
        self.provider.shutdown()


def _asgi_headers() -> Getter[list[tuple[bytes, bytes]]]:
    """An OpenTelemetry ``Getter`` over ASGI's ``[(name, value), ...]`` byte headers.

    Built with a :class:`Tracer` (``Getter`` is OpenTelemetry's class, imported only when tracing is on).
    """
    from opentelemetry.propagators.textmap import Getter

    class AsgiHeaders(Getter[list[tuple[bytes, bytes]]]):
        def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
            wanted_name = key.lower().encode("latin-1")
            values = [value.decode("latin-1") for name, value in carrier if name == wanted_name]
            return values or None

        def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
            return [name.decode("latin-1") for name, _ in carrier]

    return AsgiHeaders()


# The one tracer of this process, and the hooks the call sites hold.

_active: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """Make ``tracer`` the one the hooks use (None: tracing off)."""
    global _active
    _active = tracer


def enabled() -> bool:
    """Whether a tracer is installed (tracing on)."""
    return _active is not None


def decoding() -> contextlib.AbstractContextManager[Any]:
    """Around one image's decode + preprocess: a ``decode`` span, or nothing when tracing is off."""
    return _active.span("decode") if _active is not None else _NO_SPAN


def queued() -> Ticket | None:
    """Called as an input is queued, in its request's context: what its batch needs to trace it."""
    return _active.ticket() if _active is not None else None


def batch_started(model: str, version: str, reason: str, tickets: Sequence[Ticket | None]) -> BatchTrace | None:
    """A batch starts its run: its span, linked to the requests whose ``tickets`` it runs.

    Never raises: a fault in tracing is logged and the batch runs untraced (the batcher's loop
    must not die of it).
    """
    if _active is None:
        return None
    try:
        return _active.start_batch(model, version, reason, tickets)
    except Exception:
        log.exception("tracing a batch of %s/%s failed; it runs untraced", model, version)
        return None


def batch_ended(batch: BatchTrace | None, error: BaseException | None = None) -> None:
    """A batch's run ended (``error``: why it failed): end its span and its requests' ``compute`` spans.

    Never raises (as :func:`batch_started`).
    """
    if batch is not None and _active is not None:
        try:
            _active.end_batch(batch, error)
        except Exception:
            log.exception("ending a batch's trace failed")


def from_environment(environ: Mapping[str, str]) -> Tracer | None:
    """The tracer ``environ`` asks for (see :func:`wanted`), exporting OTLP/HTTP in batches; else None.

    Without the ``otel`` extra installed it logs a warning and returns None: the server runs
    untraced rather than not at all.
    """
    if not wanted(environ):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("an OTLP endpoint is set, but OpenTelemetry is missing (%s): pip install 'patchserve[otel]'", exc)
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # OTEL_EXPORTER_OTLP_*, OTEL_BSP_*
    log.info("tracing on: OTLP/HTTP to %s", environ.get(ENDPOINT_VARIABLES[1]) or environ.get(ENDPOINT_VARIABLES[0]))
    return Tracer(provider)
