"""bench/pyloadgen.py against a small HTTP/1.1 server: counts, statuses, the multipart bodies it sends."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

from bench import pyloadgen


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn answers
    bodies: ClassVar[list[bytes]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.bodies.append(body)
            count = len(self.bodies)
        status = 503 if count % 4 == 0 else 200  # every fourth request refused
        answer = b'{"ok": true}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def test_it_keeps_the_connections_busy_and_counts_what_the_server_answered(tmp_path) -> None:
    files = []
    for name, data in [("a.jpg", b"\xff\xd8first\xff\xd9"), ("b.jpg", b"\xff\xd8second\xff\xd9")]:
        (tmp_path / name).write_bytes(data)
        files.append(tmp_path / name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/m/classify"
        result = pyloadgen.run(url, files, concurrency=3, seconds=0.5, processes=2)
    finally:
        server.shutdown()
        server.server_close()
    served = len(Handler.bodies)
    assert result.requests == served > 0  # every request sent was answered and counted
    assert result.error_detail["status"] == served // 4 and result.errors == served // 4
    assert result.throughput == (served - served // 4) / 0.5
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
    assert result.error_detail["client_cpu_ms_per_request"] > 0
    first = Handler.bodies[0]
    assert first.startswith(b"--" + pyloadgen.BOUNDARY.encode() + b'\r\nContent-Disposition: form-data; name="image"')
    assert {b"\xff\xd8first\xff\xd9" in body for body in Handler.bodies} == {True, False}  # both files posted
