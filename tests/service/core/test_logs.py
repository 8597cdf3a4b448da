"""The per-request log line and the JSON log format."""

from __future__ import annotations

import json
import logging
import logging.config
import subprocess
import sys

import pytest

from service.core.logs import ACCESS_LOGGER, JsonFormatter, log_config
from service.http.middleware.access_log import MAX_LOGGED_PATH, logged_path
from tests.conftest import ROOT, running_app

pytestmark = pytest.mark.anyio
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


async def test_one_structured_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=ACCESS_LOGGER)
    async with running_app() as client:
        caplog.clear()
        ok = await client.post(
            "/v1/models/vit-digits/classify", files=[("image", DIGIT_7)] * 3, headers={"X-Request-ID": "log-1"}
        )
        missing = await client.post("/v1/models/nope/classify", files={"image": DIGIT_7})
        await client.get("/healthz")
    lines = [r for r in caplog.records if r.name == ACCESS_LOGGER and r.getMessage().startswith("POST")]
    assert len(lines) == 2
    first, second = lines
    assert first.levelno == logging.INFO
    assert (first.request_id, first.status, first.model, first.version) == ("log-1", 200, "vit-digits", "1")
    assert len(first.batch_size) == 3 and all(1 <= b <= 8 for b in first.batch_size)
    timing = ok.headers["server-timing"]
    for name in ("decode", "queue", "compute"):
        assert f"{name};dur={getattr(first, name + '_ms'):.3f}" in timing
    assert first.total_ms > 0
    assert (second.status, second.request_id) == (404, missing.headers["x-request-id"])
    assert not hasattr(second, "model")  # an unknown model is not named in the log either
    received = [r for r in caplog.records if r.getMessage().startswith("request received POST")]
    assert [r.request_id for r in received][:1] == ["log-1"]
    probes = [r for r in caplog.records if r.getMessage().startswith("GET /healthz")]
    assert [r.levelno for r in probes] == [logging.DEBUG]


def test_json_lines_carry_the_structured_fields() -> None:
    record = logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, "POST %s", ("/x",), None)
    record.status, record.model, record.batch_size = 200, "vit-digits", [4]
    document = json.loads(JsonFormatter().format(record))
    assert document["message"] == "POST /x" and document["level"] == "info" and document["logger"] == ACCESS_LOGGER
    assert (document["status"], document["model"], document["batch_size"]) == (200, "vit-digits", [4])
    assert document["time"].endswith("Z") and isinstance(document["pid"], int)


def test_log_config_is_valid_for_both_formats() -> None:
    root = logging.getLogger()
    saved = (root.level, root.handlers[:])
    try:
        for fmt in ("text", "json"):
            config = log_config("info", fmt)
            logging.config.dictConfig(config)
            assert config["handlers"]["stderr"]["formatter"] == fmt
            assert root.level == logging.INFO and logging.getLogger("PIL").level == logging.INFO
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.captureWarnings(False)  # the configuration turned it on; pytest records warnings itself


async def test_a_long_path_is_cut_in_the_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with running_app() as client:
        caplog.clear()
        assert (await client.get("/v1/models/" + "x" * 5000)).status_code == 404
    (line,) = [r for r in caplog.records if r.name == ACCESS_LOGGER and r.getMessage().startswith("GET")]
    assert line.path == "/v1/models/" + "x" * (MAX_LOGGED_PATH - 11) + f"...(+{5011 - MAX_LOGGED_PATH} characters)"
    assert len(line.getMessage()) < MAX_LOGGED_PATH + 200


async def test_a_path_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    # %0a in the URL is a line feed in the decoded path: written raw, the text log had a second,
    # forged line ("... INFO patchserve.access [1] POST /admin status=200"); %00 wrote a NUL.
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with running_app() as client:
        caplog.clear()
        forged = "/v1/models/x%0a2026-12-04%2011:00:00,000%20INFO%20POST%20/admin%20status=200%00%E2%80%A8/classify"
        assert (await client.post(forged, files={"image": DIGIT_7})).status_code == 404
    (line,) = [r for r in caplog.records if r.name == ACCESS_LOGGER and r.getMessage().startswith("POST")]
    message = line.getMessage()
    assert "\n" not in message and "\x00" not in message and "\u2028" not in message
    assert line.path == "/v1/models/x\\n2026-12-04 11:00:00,000 INFO POST /admin status=200\\x00\\u2028/classify"
    assert logged_path("/a\\nb") == "/a\\\\nb"  # a backslash doubled: no path reads as an escaped one


def test_python_warnings_are_json_lines_in_json_mode() -> None:
    # A library's warnings (numpy's, FastAPI's) went to stderr as multi-line text.
    script = (
        "import logging.config, warnings\n"
        "from service.core.logs import log_config\n"
        "logging.config.dictConfig(log_config('info', 'json'))\n"
        "warnings.warn('Mean of empty slice', RuntimeWarning)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = done.stderr.splitlines()
    documents = [json.loads(line) for line in lines]  # every line one JSON object
    (warning,) = [d for d in documents if d["logger"] == "py.warnings"]
    assert warning["level"] == "warning" and "RuntimeWarning: Mean of empty slice" in warning["message"]


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_what_a_clients_bytes_make_libraries_say_is_debug(level: str, shown: bool) -> None:
    # A TIFF with 161 samples per pixel logged "ERROR PIL.TiffImagePlugin ..." and corrupt EXIF a
    # py.warnings WARNING, for a file the client was already answered about (a tester, 2026-12-07);
    # uvicorn warned of every request it could not parse. Pillow outside a decode thread (a codec that
    # failed to load, a font feature missing while a picture is drawn) keeps its level (a reviewer's).
    script = (
        "import logging, logging.config, threading, warnings\n"
        "from service.core.logs import DECODE_THREADS, log_config\n"
        f"logging.config.dictConfig(log_config({level!r}, 'json'))\n"
        "def client_file():\n"
        "    logging.getLogger('PIL.TiffImagePlugin').error('More samples per pixel than can be decoded: 161')\n"
        "    warnings.warn_explicit('Corrupt EXIF data', UserWarning, '/x/site-packages/PIL/TiffImagePlugin.py', 982)\n"
        "decoding = threading.Thread(target=client_file, name=DECODE_THREADS + '_0')\n"
        "decoding.start(); decoding.join()\n"
        "logging.getLogger('uvicorn.error').warning('Invalid HTTP request received.')\n"
        "warnings.warn_explicit('Raqm layout not available', UserWarning, '/x/site-packages/PIL/ImageFont.py', 276)\n"
        "warnings.warn('ours', UserWarning)\n"
        "logging.getLogger('service').error('a fault of ours')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    documents = [json.loads(line) for line in done.stderr.splitlines()]
    demoted = [d for d in documents if d["level"] == "debug"]
    assert len(demoted) == (3 if shown else 0)
    assert all(
        "PIL" in d["logger"] or "TiffImagePlugin" in d["message"] or d["logger"] == "uvicorn.error" for d in demoted
    )
    kept = [(d["logger"], d["level"], "ImageFont" in d["message"]) for d in documents if d["level"] != "debug"]
    assert kept == [("py.warnings", "warning", True), ("py.warnings", "warning", False), ("service", "error", False)]
