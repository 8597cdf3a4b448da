"""Kubernetes manifests: the core ones against the API schemas (kubernetes-validate --strict), the
KServe InferenceService against the fields of KServe's v1beta1 PredictorSpec."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT

K8S = ROOT / "k8s"
CORE = [
    K8S / "deployment.yaml",
    K8S / "service.yaml",
    K8S / "hpa.yaml",
    K8S / "extras" / "hpa-queue-depth.yaml",
    K8S / "model-repository.yaml",
]
ISVC = K8S / "kserve" / "inferenceservice.yaml"

# KServe v1beta1 (pkg/apis/serving/v1beta1): PredictorSpec = the framework specs (one-of) +
# model + storageUris + workerSpec + an inline core/v1 PodSpec + an inline ComponentExtensionSpec.
PREDICTOR_IMPLEMENTATIONS = {
    "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "huggingface", "pmml", "lightgbm", "paddle",
    "model", "storageUris", "workerSpec",
}  # fmt: skip
COMPONENT_EXTENSION = {
    "minReplicas": int, "maxReplicas": int, "scaleTarget": int, "scaleMetric": str, "containerConcurrency": int,
    "timeout": int, "canaryTrafficPercent": int, "logger": dict, "batcher": dict, "labels": dict,
    "annotations": dict, "deploymentStrategy": dict,
}  # fmt: skip
SCALE_METRICS = {"cpu", "memory", "concurrency", "rps"}  # +kubebuilder:validation:Enum
KSERVE_CONTAINER = "kserve-container"  # constants.InferenceServiceContainerName


def validate(document: dict) -> None:
    """kubernetes-validate --strict, through its Python API (raises on a schema violation)."""
    kubernetes_validate.validate(document, kubernetes_validate.utils.latest_version(), strict=True)


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(K8S)))
def test_core_manifests_pass_kubernetes_validate_strict(path: Path) -> None:
    cli = Path(sys.executable).parent / "kubernetes-validate"
    result = subprocess.run([str(cli), "--strict", str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and "passed" in result.stdout, result.stdout + result.stderr


def test_strict_validation_does_reject_an_unknown_field() -> None:
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_deployment_probes_resources_and_shutdown() -> None:
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (
        float(env["PATCHSERVE_DRAIN_DELAY"]) + float(env["PATCHSERVE_GRACEFUL_SHUTDOWN_TIMEOUT"])
        < pod["terminationGracePeriodSeconds"]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    service = yaml.safe_load((K8S / "service.yaml").read_text())
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_every_pod_polls_the_shared_model_repository() -> None:
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert float(env["PATCHSERVE_REPOSITORY_POLL_SECONDS"]) > 0
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "models"]
    assert mount["mountPath"] == env["PATCHSERVE_MODEL_REPOSITORY"] and mount["readOnly"] is True
    (seed,) = pod["initContainers"]
    assert [m["mountPath"] for m in seed["volumeMounts"]] == [mount["mountPath"]]  # it fills the same volume
    assert seed["command"] == ["python", "-m", "service.process.seed", "/models", mount["mountPath"]]
    assert "COPY model_repository /models" in (K8S.parent / "docker" / "Dockerfile.gpu").read_text()
    (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
    claim, publisher = yaml.safe_load_all((K8S / "model-repository.yaml").read_text())
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every pod reads it, the publisher writes it
    assert publisher["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_inferenceservice_uses_only_fields_of_the_v1beta1_predictor_spec() -> None:
    isvc = yaml.safe_load(ISVC.read_text())
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert set(isvc) == {"apiVersion", "kind", "metadata", "spec"} and set(isvc["spec"]) == {"predictor"}
    predictor = isvc["spec"]["predictor"]
    assert not PREDICTOR_IMPLEMENTATIONS & set(predictor)  # a custom predictor: containers, no framework spec

    extension = {k: v for k, v in predictor.items() if k in COMPONENT_EXTENSION}
    for key, value in extension.items():
        assert isinstance(value, COMPONENT_EXTENSION[key]), (key, value)
    assert 0 <= extension["minReplicas"] <= extension["maxReplicas"]
    assert extension["scaleMetric"] in SCALE_METRICS and extension["containerConcurrency"] >= 0

    # Everything else is the inline PodSpec: validate it as a Pod's spec, strictly.
    pod_spec = {k: copy.deepcopy(v) for k, v in predictor.items() if k not in COMPONENT_EXTENSION}
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"}, "spec": pod_spec})

    (container,) = pod_spec["containers"]
    assert container["name"] == KSERVE_CONTAINER
    env = {e["name"]: e["value"] for e in container["env"]}
    (port,) = container["ports"]
    assert str(port["containerPort"]) == env["PATCHSERVE_PORT"]  # the server listens where KServe sends traffic
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"  # Open Inference Protocol
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert int(env["PATCHSERVE_MAX_IN_FLIGHT"]) == extension["containerConcurrency"]


def test_an_unknown_predictor_field_would_be_caught() -> None:
    isvc = yaml.safe_load(ISVC.read_text())
    predictor = isvc["spec"]["predictor"]
    predictor["minReplica"] = 1  # a typo: neither a ComponentExtensionSpec nor a PodSpec field
    pod_spec = {k: v for k, v in predictor.items() if k not in COMPONENT_EXTENSION}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"}, "spec": pod_spec})
