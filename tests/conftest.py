"""Shared fixtures: settings, in-process apps, real server processes, test images."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = ROOT / "model_repository"
SERVE_PYTHON = ROOT / ".venv-serve" / "bin" / "python"


def served_version(name: str) -> Path:
    """The folder of the committed version of ``name`` the default policy serves: the highest number."""
    return max((p for p in (MODEL_REPOSITORY / name).iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def num_queries(name: str) -> int:
    """A committed detector's number of object queries: the Q of its served graph's ``pred_boxes`` (B, Q, 4)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(served_version(name) / "model.onnx"), providers=["CPUExecutionProvider"])
    (queries,) = {o.shape[1] for o in session.get_outputs() if o.name == "pred_boxes"}
    return int(queries)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def png_bytes(pixels: np.ndarray) -> bytes:
    """uint8 (H, W) or (H, W, 3) -> PNG file bytes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def make_settings(**overrides: object):
    """Settings for tests: the committed repository, CPU, no environment variables read."""
    from service.core.settings import Settings

    # One model instance: tests hold the runner busy to make requests queue behind it. The auto-tuner
    # is off (it measures for seconds and would make batching depend on the machine); its own tests
    # turn it on.
    values = {
        "model_repository": MODEL_REPOSITORY,
        "device": "cpu",
        "decode_threads": 2,
        "instances": 1,
        "auto_tune": False,
        **overrides,
    }
    return Settings(**values)


@asynccontextmanager
async def running_app(settings=None, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process app with its lifespan running, ready, and an httpx client bound to it."""
    from service.http.app import create_app

    app = create_app(settings or make_settings(**overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(6000):  # a bound on waiting for the models to load, never a measured figure
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("app never became ready: " + (await client.get("/readyz")).text)
            client.app = app  # type: ignore[attr-defined]
            yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_TAKEN = "address already in use"  # the server's "cannot listen" line when its port is taken (errno 98)


def _launch(python: Path, env: dict[str, str] | None) -> subprocess.Popen:
    """``python -m service`` on a port that was free a moment ago; its output in ``log_path``, its URL in ``url``."""
    port = free_port()
    full_env = {
        **os.environ,
        "PATCHSERVE_HOST": "127.0.0.1",
        "PATCHSERVE_PORT": str(port),
        "PATCHSERVE_MODEL_REPOSITORY": str(MODEL_REPOSITORY),
        "PATCHSERVE_DEVICE": "cpu",
        "PATCHSERVE_DRAIN_DELAY": "0",
        "PATCHSERVE_AUTO_TUNE": "false",  # tests of the tuner turn it on in env
        **(env or {}),
    }
    fd, log_name = tempfile.mkstemp(prefix="patchserve-server-", suffix=".log")
    with os.fdopen(fd, "w") as log_file:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            [str(python), "-m", "service"],
            cwd=ROOT,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    process.log_path = Path(log_name)  # type: ignore[attr-defined]
    process.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return process


def _ready(process: subprocess.Popen, ready_timeout: float) -> bool:
    """Wait until ``process`` answers /readyz with 200 (True); False if another process had taken its port.

    Raises:
        RuntimeError: it exited for another reason, or was not ready within ``ready_timeout`` s.
    """
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = process.log_path.read_text()  # type: ignore[attr-defined]
            if PORT_TAKEN in log:
                return False
            raise RuntimeError(f"server exited with {process.returncode}: {log}")
        try:
            if httpx.get(process.url + "/readyz", timeout=1).status_code == 200:  # type: ignore[attr-defined]
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server not ready in time")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    process.log_path.unlink(missing_ok=True)  # type: ignore[attr-defined]


@contextmanager
def server_process(
    python: Path = SERVE_PYTHON, env: dict[str, str] | None = None, ready_timeout: float = 60.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real server (``python -m service``) on a free loopback port; yields (base URL, process).

    The server's output goes to a file, ``process.log_path`` (a pipe nobody reads would fill and
    block the server); the drain delay is 0 and the auto-tuner off unless ``env`` says otherwise.
    The port is free when chosen, not necessarily when the server binds it, seconds later: if
    another process took it meanwhile, the server is started again on another one.
    """
    if not python.exists():
        pytest.fail(f"{python} missing: `make test` builds the serving environment first")
    for _ in range(3):
        process = _launch(python, env)
        try:
            if _ready(process, ready_timeout):
                break
        except BaseException:
            _stop(process)
            raise
        _stop(process)
    else:
        raise RuntimeError(f"three servers in a row found their port taken ({PORT_TAKEN})")
    try:
        yield process.url, process  # type: ignore[attr-defined]
    finally:
        _stop(process)


def require_tool(name: str, how: str) -> str:
    """The path of command ``name``; a skip without it, a failure under CI (``CI=true``)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({how})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def cifar_archive() -> Path:
    """The CIFAR-10 JPEG archive (``models.cifar.find_archive``); a skip without it, a failure under CI."""
    from models.cifar import find_archive

    try:
        return find_archive()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the CIFAR-10 archive: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def digits_test_split():
    from models.datasets import load_digits_splits

    return load_digits_splits()[1]


# The random-weight transformers presets (export.hf_presets) imported into `hf_repository`.
HF_PRESETS = ("tiny-vit", "tiny-deit-distilled", "tiny-detr")


@pytest.fixture(scope="session")
def hf_repository(tmp_path_factory) -> Path:
    """Random-weight transformers checkpoints built offline and imported with ``export hf``.

    Returns a folder holding ``checkpoints/<preset>/`` (the ``save_pretrained`` folders) and
    ``repository/`` (a model repository with those imports as version 1, beside vit-digits).
    """
    import shutil

    from export.hf import export_hf
    from export.hf_presets import build

    root = tmp_path_factory.mktemp("hf")
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", root / "repository" / "vit-digits")
    for name in HF_PRESETS:
        build(name, root / "checkpoints" / name)
        export_hf(root / "checkpoints" / name, root / "repository" / name / "1", opset=18)
    return root


class DecodeCounter:
    """How many decodes (``service.pipeline.decoding._decode_and_preprocess``) ran at once, at most."""

    def __init__(self) -> None:
        self.active = self.peak = 0
        self.lock = threading.Lock()


@pytest.fixture
def concurrent_decodes(monkeypatch: pytest.MonkeyPatch) -> DecodeCounter:
    """Counts the decodes in flight; each is held 20 ms, long enough for others to start if allowed to."""
    from service.pipeline import decoding

    counter, original = DecodeCounter(), decoding._decode_and_preprocess

    def counting(*args):
        with counter.lock:
            counter.active += 1
            counter.peak = max(counter.peak, counter.active)
        try:
            threading.Event().wait(0.02)
            return original(*args)
        finally:
            with counter.lock:
                counter.active -= 1

    monkeypatch.setattr(decoding, "_decode_and_preprocess", counting)
    return counter
