"""Model versions changed on a real server under load (issue 23's acceptance).

The server (``python -m service`` from the serving environment) serves a copy of the committed
models in a temporary folder while 8 client threads classify without naming a version. Versions
are published into that folder (tests/service/model_versions.py) and picked up by polling or by
tritonclient's load API. Every answer must be a 200 that names version 1 or 2 and equals that
version's output for its image, computed here with ONNX Runtime. Conditions are waited for with
generous deadlines; nothing asserts a time.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image

from tests.conftest import MODEL_REPOSITORY, ROOT, server_process
from tests.service.helpers import sample
from tests.service.model_versions import Reference, publish

pytestmark = pytest.mark.slow
CLIENTS = 8
CLASSIFY = "/v1/models/vit-digits/classify"
CONTROL = {"PATCHSERVE_MODEL_CONTROL_API": "true"}  # off by default, as Triton's model control mode is none
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


@dataclass
class Answer:
    started: float
    image: Path
    status: int | str
    body: dict | None


def images(folder: Path) -> list[Path]:
    """digit-7 and two other 8x8 pictures, so answers differ by image as well as by version."""
    rng = np.random.default_rng(0)
    paths = [ROOT / "examples" / "digit-7.png"]
    for i in range(2):
        path = folder / f"noise-{i}.png"
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def load(url: str, pictures: list[Path], stop: threading.Event, answers: list[Answer], offset: int) -> None:
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=url, timeout=60) as client:
        k = offset
        while not stop.is_set() and time.monotonic() < deadline:
            image, started = pictures[k % len(pictures)], time.monotonic()
            k += 1
            try:
                response = client.post(CLASSIFY, files={"image": image.read_bytes()})
                answers.append(Answer(started, image, response.status_code, response.json()))
            except (httpx.TransportError, ValueError) as exc:
                answers.append(Answer(started, image, type(exc).__name__, None))


class Load:
    """8 client threads classifying until stopped."""

    def __init__(self, url: str, pictures: list[Path]) -> None:
        self.stop, self.answers = threading.Event(), []
        self.threads = [
            threading.Thread(target=load, args=(url, pictures, self.stop, self.answers, i)) for i in range(CLIENTS)
        ]
        for thread in self.threads:
            thread.start()

    def until_answered(self, count: int, since: float = 0.0) -> None:
        until(lambda: sum(a.started >= since for a in self.answers) >= count, f"{count} answers")

    def finish(self) -> list[Answer]:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)
        return list(self.answers)


def until(condition, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def index(url: str) -> dict[str, tuple[str, str]]:
    """vit-digits' versions in the repository index: version -> (state, reason)."""
    entries = httpx.post(url + "/v2/repository/index", timeout=30).json()
    return {e["version"]: (e["state"], e["reason"]) for e in entries if e["name"] == "vit-digits"}


def check_answers(answers: list[Answer], reference: Reference, swapped_at: float) -> dict[str, int]:
    """Every answer a 200 equal to its version's output; none of version 1 started after the swap."""
    assert answers, "no answer at all"
    bad = [a for a in answers if a.status != 200]
    assert not bad, f"{len(bad)} non-2xx answers of {len(answers)}, e.g. {bad[:3]}"
    by_version: dict[str, int] = {}
    for a in answers:
        version = a.body["version"]
        assert version in ("1", "2"), a.body
        assert reference.matches(int(version), a.image, a.body), (a.image, a.body)
        by_version[version] = by_version.get(version, 0) + 1
        if a.started > swapped_at:
            assert version == "2", f"a request sent after version 1 was released went to version {version}"
    assert by_version.get("1", 0) > 0 and by_version.get("2", 0) > 0, by_version
    return by_version


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    root.mkdir()
    shutil.copytree(MODEL_REPOSITORY / "vit-digits", root / "vit-digits")
    return root


def test_polling_publishes_v2_retires_v1_and_refuses_corrupt_v3_under_load(repository: Path, tmp_path: Path) -> None:
    env = {
        "PATCHSERVE_MODEL_REPOSITORY": str(repository),
        "PATCHSERVE_REPOSITORY_POLL_SECONDS": "0.2",
        "PATCHSERVE_LOG_FORMAT": "json",
        "PATCHSERVE_INTRA_OP_THREADS": "1",
    }
    reference = Reference(repository, "vit-digits")
    with server_process(env=env, ready_timeout=90) as (url, process):
        traffic = Load(url, images(tmp_path))
        traffic.until_answered(40)
        publish(repository, "vit-digits", 2)  # (a): version 2 by polling; (c): latest 1 retires version 1
        released = {"1": ("UNAVAILABLE", "unloaded"), "2": ("READY", "")}  # kept in the index, as Triton does
        until(lambda: index(url) == released, "version 2 serving and version 1 released")
        swapped_at = time.monotonic()
        traffic.until_answered(40, since=swapped_at)
        publish(repository, "vit-digits", 3, "bad-manifest")  # (d): refused, version 2 keeps serving
        until(lambda: index(url).get("3", ("",))[0] == "UNAVAILABLE", "version 3 refused")
        assert "not_a_field" in index(url)["3"][1]
        shutil.rmtree(repository / "vit-digits" / "3")
        publish(repository, "vit-digits", 3, "wrong-input")
        until(lambda: "'pixels'" in index(url).get("3", ("", ""))[1], "the wrong-input version 3 refused")
        traffic.until_answered(40, since=time.monotonic())
        answers = traffic.finish()
        assert httpx.get(url + "/readyz").status_code == 200
        metrics = httpx.get(url + "/metrics").text

        def access_log() -> list[dict]:  # a line is written as its response ends: wait for the last ones
            lines = process.log_path.read_text().splitlines()
            records = [json.loads(line) for line in lines if '"patchserve.access"' in line]
            return [r for r in records if r.get("path") == CLASSIFY]

        until(lambda: len(access_log()) >= len(answers), "an access-log line per answer")
        logged = [r["version"] for r in access_log()]
    by_version = check_answers(answers, reference, swapped_at)
    print(f"polling: answers by version {by_version}")

    def loads(version: str, outcome: str) -> float:
        return sample(metrics, "patchserve_model_loads_total", model="vit-digits", version=version, outcome=outcome)

    assert (loads("1", "success"), loads("2", "success"), loads("3", "failure")) == (1, 1, 2)
    served = {
        v: sample(metrics, "patchserve_requests_total", model="vit-digits", version=v, outcome="success") for v in "12"
    }
    assert served == {v: float(n) for v, n in by_version.items()}  # the metrics name the version each ran on
    assert {v: logged.count(v) for v in "12"} == by_version  # and so does the access log


def test_load_api_publishes_v2_under_load_through_tritonclient(repository: Path, tmp_path: Path) -> None:
    env = {"PATCHSERVE_MODEL_REPOSITORY": str(repository), "PATCHSERVE_INTRA_OP_THREADS": "1", **CONTROL}
    reference = Reference(repository, "vit-digits")
    with server_process(env=env, ready_timeout=90) as (url, _):
        client = triton.InferenceServerClient(url=url.removeprefix("http://"))
        assert client.get_model_repository_index() == [
            {"name": "vit-digits", "version": "1", "state": "READY", "reason": ""}
        ]
        traffic = Load(url, images(tmp_path))
        traffic.until_answered(40)
        publish(repository, "vit-digits", 2)  # (b): no polling; the load API takes it
        client.load_model("vit-digits")  # returns once version 2 serves
        assert client.is_model_ready("vit-digits", "2")
        until(lambda: client.get_model_repository_index() == [
            {"name": "vit-digits", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "vit-digits", "version": "2", "state": "READY", "reason": ""},
        ], "version 1 released")  # fmt: skip
        swapped_at = time.monotonic()
        traffic.until_answered(40, since=swapped_at)
        answers = traffic.finish()
        client.unload_model("vit-digits")  # (f)
        until(lambda: {e["state"] for e in client.get_model_repository_index()} == {"UNAVAILABLE"}, "unloaded")
        assert not client.is_model_ready("vit-digits")
        client.load_model("vit-digits")
        assert client.is_model_ready("vit-digits", "2")
        client.close()
    print(f"load API: answers by version {check_answers(answers, reference, swapped_at)}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_twenty_unload_load_cycles_of_vit_cifar10_return_their_memory(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    # Version 1 alone (the plain ViT, which calls Chelsea a frog): one version per cycle, whatever else is committed
    shutil.copytree(MODEL_REPOSITORY / "vit-cifar10" / "1", root / "vit-cifar10" / "1")
    chelsea = (ROOT / "examples" / "chelsea.png").read_bytes()
    env = {"PATCHSERVE_MODEL_REPOSITORY": str(root), "PATCHSERVE_INTRA_OP_THREADS": "1", **CONTROL}
    with server_process(env=env, ready_timeout=90) as (url, process):
        client = triton.InferenceServerClient(url=url.removeprefix("http://"))

        def cycle() -> None:
            client.unload_model("vit-cifar10")
            until(lambda: client.get_model_repository_index()[0]["state"] == "UNAVAILABLE", "released")
            client.load_model("vit-cifar10")
            response = httpx.post(url + "/v1/models/vit-cifar10/classify", files={"image": chelsea}, timeout=60)
            assert response.status_code == 200 and response.json()["predictions"][0]["label"] == "frog"

        cycle()
        after_first = rss_bytes(process.pid)
        for _ in range(19):
            cycle()
        after_twenty = rss_bytes(process.pid)
        client.close()
    growth = after_twenty - after_first
    print(f"RSS after 1 cycle {after_first / 2**20:.1f} MiB, after 20 {after_twenty / 2**20:.1f} MiB, "
          f"growth {growth / 2**20:+.1f} MiB")  # fmt: skip
    assert growth <= 20 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 19 cycles"


def test_with_two_workers_one_load_request_reaches_both(repository: Path) -> None:
    env = {
        "PATCHSERVE_MODEL_REPOSITORY": str(repository),
        "PATCHSERVE_WORKERS": "2",
        "PATCHSERVE_INTRA_OP_THREADS": "1",
        **CONTROL,
    }

    def metric(name: str, **labels: str) -> float:
        return sample(httpx.get(url + "/metrics").text, name, model="vit-digits", **labels)

    with server_process(env=env, ready_timeout=90) as (url, _):
        until(lambda: metric("patchserve_model_loads_total", version="1", outcome="success") == 2, "both workers up")
        publish(repository, "vit-digits", 2)
        assert httpx.post(url + "/v2/repository/models/vit-digits/load", timeout=60).status_code == 200
        # the counters add up the workers' and the info gauge is their max: both loaded 2 and released 1
        until(lambda: metric("patchserve_model_loads_total", version="2", outcome="success") == 2, "2 on both")
        until(lambda: metric("patchserve_model_info", version="1") == 0, "1 released on both")
        versions = {httpx.post(url + CLASSIFY, files={"image": DIGIT_7}).json()["version"] for _ in range(40)}
        assert versions == {"2"}  # each on a new connection, to either worker
        assert httpx.post(url + "/v2/repository/models/vit-digits/unload", timeout=60).status_code == 200
        until(lambda: metric("patchserve_model_info", version="2") == 0, "unloaded on both")
        statuses = {httpx.post(url + CLASSIFY, files={"image": DIGIT_7}).status_code for _ in range(40)}
        assert statuses == {404}
