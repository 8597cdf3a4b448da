"""docker compose end to end: build the CPU image, start API + Prometheus, post an image, find it counted.

Runs the project's own compose files unchanged: docker-compose.yml + docker-compose.cpu.yml +
docker-compose.host.yml (build machines have no bridge network), plus a throw-away override
that only moves the ports to free ones and scrapes every second. Needs a Docker engine
(``.ci/run`` starts one with ../shared/tools/docker-local); under CI its absence is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port, require_tool

pytestmark = [pytest.mark.docker, pytest.mark.slow]
FILES = ["docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.host.yml"]
STANDIN = ROOT / "tests" / "docker" / "prometheus-standin.Dockerfile"


def docker(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"docker {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def require_engine() -> None:
    require_tool("docker", "`.ci/run` starts an engine with ../shared/tools/docker-local")
    if docker("info", timeout=30, check=False).returncode != 0:
        message = "no Docker engine answers (DOCKER_HOST={}); `docker-local up` starts one".format(
            os.environ.get("DOCKER_HOST", "unset")
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def ensure_prometheus_image(image: str) -> str:
    """The compose file's Prometheus image: present, pulled, or (no Docker Hub here) a local stand-in."""
    if docker("image", "inspect", image, check=False).returncode == 0:
        return "present"
    try:
        if docker("pull", image, timeout=60, check=False).returncode == 0:
            return "pulled"
    except subprocess.TimeoutExpired:
        pass
    docker("build", "--network", "host", "-t", image, "-f", str(STANDIN), str(STANDIN.parent))
    return "stand-in built from Debian's prometheus package"


@pytest.fixture
def compose(tmp_path: Path) -> Iterator[tuple[list[str], int, int]]:
    require_engine()
    api_port, prometheus_port = free_port(), free_port()
    scrape = tmp_path / "prometheus.yml"
    scrape.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: patchserve\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{api_port}']\n"
    )
    override = tmp_path / "ports.yml"
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "api": {"environment": {"PATCHSERVE_PORT": str(api_port), "PATCHSERVE_WORKERS": "2"}},
                    "prometheus": {
                        "command": [
                            "--config.file=/etc/prometheus/prometheus.yml",
                            "--storage.tsdb.path=/prometheus",
                            f"--web.listen-address=127.0.0.1:{prometheus_port}",
                        ],
                        "volumes": [f"{scrape}:/etc/prometheus/prometheus.yml:ro"],
                    },
                }
            }
        )
    )
    project = f"patchserve-e2e-{os.getpid()}"
    base = ["compose", "-p", project]
    for f in [*FILES, str(override)]:
        base += ["-f", f]
    try:
        yield base, api_port, prometheus_port
    finally:
        docker(*base, "down", "--volumes", "--remove-orphans", "--timeout", "30", check=False)


def test_compose_cpu_deployment_serves_and_prometheus_counts(compose: tuple[list[str], int, int]) -> None:
    base, api_port, prometheus_port = compose
    config = json.loads(docker(*base, "config", "--format", "json").stdout)
    prometheus_source = ensure_prometheus_image(config["services"]["prometheus"]["image"])

    started = time.monotonic()
    docker(*base, "build", "api", timeout=1200)
    build_seconds = time.monotonic() - started
    docker(*base, "up", "-d", "api", "prometheus", timeout=300)

    api, prometheus = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{prometheus_port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(api + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, docker(*base, "logs", "api", check=False).stdout[-3000:]
        time.sleep(0.5)
    ready_seconds = time.monotonic() - started - build_seconds

    digit = (ROOT / "examples" / "digit-7.png").read_bytes()
    response = httpx.post(api + "/v1/models/vit-digits/classify", files={"image": digit}, timeout=30)
    assert response.status_code == 200 and response.json()["predictions"][0]["label"] == "7", response.text

    query = 'sum(patchserve_requests_total{model="vit-digits",outcome="success"})'
    deadline, value = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        try:
            result = httpx.get(prometheus + "/api/v1/query", params={"query": query}, timeout=5).json()["data"][
                "result"
            ]
        except (httpx.TransportError, KeyError):
            result = []
        if result:
            value = float(result[0]["value"][1])
            if value == 1:
                break
        time.sleep(1)
    assert value == 1, docker(*base, "logs", "prometheus", check=False).stdout[-3000:]

    # The container as deployed: non-root, read-only root filesystem, metrics files on the /tmp tmpfs.
    (container,) = docker(*base, "ps", "-q", "api").stdout.split()
    inspect = json.loads(docker("inspect", container).stdout)[0]
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True and "/tmp" in inspect["HostConfig"]["Tmpfs"]
    assert inspect["State"]["Health"]["Status"] in ("healthy", "starting")
    probe = "import os, glob; print(os.getuid(), len(glob.glob('/tmp/patchserve-metrics-*/*.db')))"
    uid, db_files = docker(*base, "exec", "-T", "api", "python", "-c", probe).stdout.split()
    assert uid == "10001" and int(db_files) >= 2
    assert docker(*base, "exec", "-T", "api", "touch", "/models/x", check=False).returncode != 0

    # `docker compose stop` sends SIGTERM to PID 1 (exec-form CMD): the server drains and exits 0.
    docker(*base, "stop", "api", timeout=120)
    assert json.loads(docker("inspect", container).stdout)[0]["State"]["ExitCode"] == 0
    print(
        f"prometheus image: {prometheus_source}; CPU image build {build_seconds:.0f} s; "
        f"ready {ready_seconds:.0f} s after; Prometheus counted {value:g} request"
    )
