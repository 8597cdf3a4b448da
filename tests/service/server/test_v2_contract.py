"""tritonclient against a real server with API keys, on the committed models (issue 15 G).

tritonclient reads a v2 error's ``{"error": ...}``; before, the 401 (and the in-flight 503 and
the 405) were problem+json, and tritonclient reported "an exception occurred in the client while
decoding the response: 'error'". perf_analyzer's default run fills inputs with random bytes
(NaN and infinities in FP32), which were refused as non-finite; they are run, as in Triton.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import server_process

pytestmark = pytest.mark.slow
KEY = "k-15"


@pytest.fixture(scope="module")
def server():
    with server_process(env={"PATCHSERVE_API_KEYS": KEY}) as (url, _):
        yield url


def _random_bytes_input(shape: list[int], seed: int) -> triton.InferInput:
    """What perf_analyzer sends by default: random bytes as the FP32 tensor."""
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * 4, dtype=np.uint8)
    x = raw.view(np.float32).reshape(shape)
    assert not np.isfinite(x).all()  # NaN or infinity among them, as in perf_analyzer's data
    tensor = triton.InferInput("pixel_values", shape, "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_a_missing_key_is_a_401_message_tritonclient_reads(server: str) -> None:
    client = triton.InferenceServerClient(server.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata("vit-digits")
    finally:
        client.close()
    assert refused.value.status() == "401"
    assert "API key" in refused.value.message() and "decoding the response" not in str(refused.value)


@pytest.mark.parametrize(("model", "shape"), [("vit-cifar10", [2, 3, 32, 32]), ("detr-digits", [2, 1, 128, 128])])
@pytest.mark.parametrize("binary", [True, False])
def test_perf_analyzers_random_bytes_are_run_and_json_stays_valid(server: str, model: str, shape, binary) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    client = triton.InferenceServerClient(server.removeprefix("http://"))
    try:
        config = client.get_model_config(model, headers=headers)
        outputs = [triton.InferRequestedOutput(o["name"], binary_data=binary) for o in config["output"]]
        result = client.infer(model, [_random_bytes_input(shape, seed=15)], outputs=outputs, headers=headers)
    finally:
        client.close()
    for output in config["output"]:
        values = result.as_numpy(output["name"])
        assert values.shape[0] == 2 and values.dtype == np.float32
    # What config says is what the server runs: the sessions and batch size GET /v1/models reports.
    auth = {"Authorization": f"Bearer {KEY}"}  # tritonclient added its own headers to `headers`
    served = httpx.get(f"{server}/v1/models/{model}", headers=auth).json()["versions"][-1]
    assert config["max_batch_size"] == 32 and config["instance_group"][0]["count"] == served["instances"]
    assert config["dynamic_batching"]["preferred_batch_size"] == [served["batching"]["max_batch_size"]]
    health = httpx.get(server + "/v2/health/ready")  # the worker serves on
    assert health.status_code == 200
