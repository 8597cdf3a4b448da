"""OpenTelemetry tracing: off unless asked (and then not even imported), and when on, a server
span per request in the caller's trace with its four children, and batch spans linked to
exactly the requests they ran.

The in-process test collects spans in memory; the real-server test points the server's
OTLP/HTTP exporter at a receiver in this process that decodes the protobuf with
``opentelemetry-proto``. Neither asserts a time: they wait for spans with a bounded poll.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, SERVE_PYTHON, make_settings, server_process

DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
CHILDREN = {"read body", "decode", "queue", "compute"}
REQUESTS = 8


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_SERVICE_NAME": "patchserve"}, False),
    ],
)
def test_tracing_is_on_only_with_an_endpoint_and_the_sdk_not_disabled(environ: dict, expected: bool) -> None:
    from service.core.tracing import wanted

    assert wanted(environ) is expected


# FastAPI >= 0.16x depends on opentelemetry-api and imports it itself (its native telemetry,
# inert until a provider is configured). So "off" means: importing and building the app loads no
# OpenTelemetry module beyond those `import fastapi` loads, and never the SDK, an exporter or proto.
_IMPORTS = """
import sys
def otel():
    return {m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")}
import fastapi
by_fastapi = otel()
from service.http.app import build_app
app = build_app()
ours = sorted(otel() - by_fastapi)
heavy = sorted(m for m in otel() if m.split(".")[1:2] in (["sdk"], ["exporter"], ["proto"]))
print("ours:", ours, "heavy:", heavy)
"""


@pytest.mark.parametrize(
    "extra", [{}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}]
)
def test_off_no_opentelemetry_module_is_imported(extra: dict) -> None:
    python = SERVE_PYTHON if SERVE_PYTHON.exists() else Path(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FASTAPI_OTEL"))}
    env.update(extra, PATCHSERVE_MODEL_REPOSITORY=str(ROOT / "model_repository"), PATCHSERVE_DEVICE="cpu")
    done = subprocess.run([str(python), "-c", _IMPORTS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ours: [] heavy: []" in done.stdout, done.stdout


# What the tests below check in the spans, whichever way they were collected.


@dataclass(frozen=True)
class Span:
    """One finished span, as either collector saw it (ids as lowercase hex)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    attributes: dict
    links: tuple[tuple[str, str], ...]  # (trace id, span id)


@dataclass(frozen=True)
class Caller:
    trace_id: str
    parent_id: str
    request_id: str

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-01"


def _callers(n: int) -> list[Caller]:
    return [Caller(f"{0xA0 + i:02x}" * 16, f"{0xB0 + i:02x}" * 8, f"caller-{i}") for i in range(n)]


@dataclass
class TraceCheck:
    """Finds, in a set of spans, what each caller's request and each batch should have left."""

    callers: list[Caller]
    model: str
    problems: list[str] = field(default_factory=list)

    def complete(self, spans: list[Span]) -> bool:
        """True once every caller's server span, its four children and every batch linking them are there."""
        self.problems = []
        servers = self._servers(spans)
        for caller in self.callers:
            server = servers.get(caller)
            if server is None:
                self.problems.append(f"no server span for {caller}")
                continue
            names = Counter(s.name for s in spans if s.parent_id == server.span_id and s.trace_id == caller.trace_id)
            if names != Counter(CHILDREN):
                self.problems.append(f"{caller.request_id}: children {dict(names)}")
        linked = Counter(link for s in spans if s.name == "batch" for link in s.links)
        wanted = {(s.trace_id, s.span_id) for s in servers.values()}
        if not wanted <= set(linked):
            self.problems.append(f"{len(wanted - set(linked))} request(s) not linked from a batch yet")
        return not self.problems

    def _servers(self, spans: list[Span]) -> dict[Caller, Span]:
        found = {}
        for caller in self.callers:
            matches = [
                s
                for s in spans
                if s.kind == "SERVER" and s.trace_id == caller.trace_id and s.parent_id == caller.parent_id
            ]
            assert len(matches) <= 1, matches
            if matches:
                found[caller] = matches[0]
        return found

    def assert_all(self, spans: list[Span]) -> None:
        """Every assertion on the complete set of spans."""
        assert self.complete(spans), self.problems
        servers = self._servers(spans)
        by_id = {(s.trace_id, s.span_id): s for s in spans}
        batches = [s for s in spans if s.name == "batch" and s.attributes.get("patchserve.model") == self.model]
        batch_of: dict[tuple[str, str], Span] = {}
        for batch in batches:
            assert batch.parent_id is None  # a root: it belongs to no one caller's trace
            assert batch.trace_id not in {c.trace_id for c in self.callers}
            assert batch.attributes["patchserve.model.version"] == "1"
            assert batch.attributes["patchserve.batch.reason"] in {"size", "delay", "idle"}
            assert batch.attributes["patchserve.batch.size"] == len(batch.links) >= 1
            for link in batch.links:
                assert link not in batch_of, f"{link} linked from two batches"
                batch_of[link] = batch
        for caller, server in servers.items():
            assert server.name == "POST /v1/models/{name}/classify"
            assert server.attributes["patchserve.request_id"] == caller.request_id
            assert server.attributes["http.route"] == "/v1/models/{name}/classify"
            assert server.attributes["http.response.status_code"] == 200
            assert server.attributes["patchserve.model"] == self.model
            batch = batch_of[(server.trace_id, server.span_id)]
            compute = next(s for s in spans if s.parent_id == server.span_id and s.name == "compute")
            # The request's compute span links to the batch that ran it, and that batch links back.
            assert compute.links == ((batch.trace_id, batch.span_id),)
            assert compute.attributes["patchserve.batch.size"] == batch.attributes["patchserve.batch.size"]
        # Every link of every batch is one of these requests: the batches ran exactly them.
        assert set(batch_of) == {(s.trace_id, s.span_id) for s in servers.values()}
        assert all(by_id.get(link) is not None for link in batch_of)


def _headers(caller: Caller) -> dict[str, str]:
    return {"traceparent": caller.traceparent, "X-Request-ID": caller.request_id}


# In process: spans collected in memory.


def _memory_tracer():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service.core.tracing import Tracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracer(provider), exporter


def _from_sdk(span) -> Span:
    parent = span.parent
    return Span(
        name=span.name,
        trace_id=f"{span.context.trace_id:032x}",
        span_id=f"{span.context.span_id:016x}",
        parent_id=f"{parent.span_id:016x}" if parent is not None else None,
        kind=span.kind.name,
        attributes=dict(span.attributes),
        links=tuple((f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links),
    )


@asynccontextmanager
async def _traced_app(tracer, **overrides) -> AsyncIterator[httpx.AsyncClient]:
    from service.http.app import create_app

    app = create_app(make_settings(**overrides), tracer=tracer)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for _ in range(6000):  # a bound on waiting for the models to load, never a measured figure
            if (await client.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        yield client


@pytest.mark.anyio
async def test_in_process_each_request_and_batch_is_traced() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
    tracer, exporter = _memory_tracer()
    callers = _callers(REQUESTS)
    async with _traced_app(tracer, max_queue_delay=0.05, max_batch_size=4) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7}, headers=_headers(c))
                for c in callers
            )
        )
        assert [r.json()["predictions"][0]["label"] for r in responses] == ["7"] * REQUESTS
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/v2/models/vit-digits/ready")).status_code == 200
        assert (await client.get("/v2/models/vit-digits/versions/1/ready")).status_code == 200
        assert (await client.get("/v2/models/vit-digits")).status_code == 200  # metadata: traced
    spans = [_from_sdk(s) for s in exporter.get_finished_spans()]
    TraceCheck(callers, "vit-digits").assert_all(spans)
    paths = {s.attributes.get("url.path") for s in spans}
    probes = {"/healthz", "/readyz", "/v2/models/vit-digits/ready", "/v2/models/vit-digits/versions/1/ready"}
    assert not paths & probes  # probes, the app's and KServe's model readiness: untraced
    assert "/v2/models/vit-digits" in paths


@pytest.mark.anyio
async def test_a_request_without_traceparent_starts_a_trace_and_a_failed_one_is_marked() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
    tracer, exporter = _memory_tracer()
    async with _traced_app(tracer) as client:
        ok = await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7})
        bad = await client.post("/v1/models/vit-digits/classify", files={"image": b"not an image"})
    assert (ok.status_code, bad.status_code) == (200, 415)
    finished = list(exporter.get_finished_spans())
    servers = [s for s in finished if s.kind.name == "SERVER"]
    assert [s.attributes["http.response.status_code"] for s in servers] == [200, 415]
    assert all(s.parent is None for s in servers)  # no traceparent: each its own trace
    failed = servers[1]
    decode = next(s for s in finished if s.name == "decode" and s.parent.span_id == failed.context.span_id)
    assert decode.status.status_code.name == "ERROR"
    assert not [s for s in finished if s.name == "queue" and s.parent.span_id == failed.context.span_id]


# A real server exporting OTLP/HTTP to a receiver in this process.


class _Receiver(ThreadingHTTPServer):
    """A minimal OTLP/HTTP trace receiver: decodes each POST /v1/traces and keeps its spans."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        self.spans: list[Span] = []
        self.resources: list[dict] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest.FromString(body)
        spans, resources = [], []
        for resource_spans in request.resource_spans:
            resources.append({kv.key: _value(kv.value) for kv in resource_spans.resource.attributes})
            for scope_spans in resource_spans.scope_spans:
                spans.extend(_from_proto(s) for s in scope_spans.spans)
        with self.server.lock:
            self.server.spans.extend(spans)
            self.server.resources.extend(resources)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _from_proto(span) -> Span:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

    return Span(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() or None,
        kind=ProtoSpan.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        attributes={kv.key: _value(kv.value) for kv in span.attributes},
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
    )


@contextmanager
def _receiver() -> Iterator[_Receiver]:
    receiver = _Receiver()
    thread = threading.Thread(target=receiver.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_server_exports_request_and_batch_spans_over_otlp_http() -> None:
    pytest.importorskip("opentelemetry.proto", reason="the dev extra installs opentelemetry-proto")
    callers = _callers(REQUESTS)
    with _receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "patchserve-test",
            "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: export soon, so the poll below ends soon
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            "PATCHSERVE_MAX_QUEUE_DELAY": "0.05",  # room for concurrent requests to share batches
            "PATCHSERVE_MAX_BATCH_SIZE": "4",
        }
        with server_process(env=env) as (url, process):

            async def send_all() -> list[httpx.Response]:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    return await asyncio.gather(
                        *(
                            client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7}, headers=_headers(c))
                            for c in callers
                        )
                    )

            responses = asyncio.run(send_all())
            assert [r.status_code for r in responses] == [200] * REQUESTS
            assert [r.headers["x-request-id"] for r in responses] == [c.request_id for c in callers]
            check = TraceCheck(callers, "vit-digits")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with receiver.lock:
                    spans = list(receiver.spans)
                if check.complete(spans):
                    break
                time.sleep(0.1)
            log = process.log_path.read_text()  # type: ignore[attr-defined]
        assert check.complete(spans), f"{check.problems}\nserver log:\n{log}"
        check.assert_all(spans)
        assert {r.get("service.name") for r in receiver.resources} == {"patchserve-test"}


@pytest.mark.anyio
async def test_a_fault_in_tracing_a_batch_does_not_fail_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
    from service.core.tracing import Tracer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in tracing")

    monkeypatch.setattr(Tracer, "start_batch", broken)
    tracer, exporter = _memory_tracer()
    async with _traced_app(tracer) as client:
        first = await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7})
        second = await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7})
    assert [first.status_code, second.status_code] == [200, 200]  # the batcher's loop lives on
    assert second.json()["predictions"][0]["label"] == "7"
    names = [s.name for s in exporter.get_finished_spans()]
    assert "batch" not in names and names.count("decode") == 2
