"""The Open Inference Protocol (KServe v2) in process: metadata, JSON and binary tensors, errors."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import re
import struct
import warnings
import zlib

import numpy as np
import orjson
import pytest

from service.runtime.manifest import load_manifest
from service.tasks.classification import classify
from tests.conftest import MODEL_REPOSITORY, ROOT, png_bytes, running_app
from tests.service.helpers import INFER, digit_tensor, json_request

pytestmark = pytest.mark.anyio


DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


MANIFEST = load_manifest(MODEL_REPOSITORY / "vit-digits" / "1" / "model.json")


def binary_request(x: np.ndarray, document: dict | None = None) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor body: the JSON header, then x's little-endian bytes."""
    raw = x.astype("<f4").tobytes()
    document = document or {}
    document.setdefault(
        "inputs",
        [
            {
                "name": "pixel_values",
                "shape": list(x.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
    )
    header = orjson.dumps(document)
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def read_binary_response(response) -> dict[str, np.ndarray]:
    """Split a binary response as the protocol says: JSON of the header's length, then tensors in order."""
    length = int(response.headers["inference-header-content-length"])
    document = orjson.loads(response.content[:length])
    offset, tensors = length, {}
    for output in document["outputs"]:
        size = output["parameters"]["binary_data_size"]
        chunk = response.content[offset : offset + size]
        tensors[output["name"]] = np.frombuffer(chunk, "<f4").reshape(output["shape"])
        offset += size
    assert offset == len(response.content)
    return tensors


def assert_error(response, status: int, part: str = "") -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and part in body["error"], body
    return body["error"]


async def test_health_and_server_metadata() -> None:
    async with running_app() as client:
        live = await client.get("/v2/health/live")
        ready = await client.get("/v2/health/ready")
        meta = await client.get("/v2")
        head = await client.head("/v2/health/ready")
    assert live.status_code == 200 and ready.status_code == 200 and head.status_code == 200
    assert meta.json() == {
        "name": "patchserve",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "classification", "model_configuration", "model_repository"],
    }


async def test_model_metadata_ready_and_config() -> None:
    async with running_app(max_batch_size=4, max_queue_delay=0.005) as client:
        meta = (await client.get("/v2/models/vit-digits")).json()
        by_version = (await client.get("/v2/models/vit-digits/versions/1")).json()
        ready = await client.get("/v2/models/vit-digits/versions/1/ready")
        config = (await client.get("/v2/models/vit-digits/config")).json()
    assert (
        meta
        == by_version
        == {
            "name": "vit-digits",
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, 8, 8]}],
            "outputs": [
                {"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                {"name": "embedding", "datatype": "FP32", "shape": [-1, 32]},  # issue 16: vit-digits embeds
            ],
        }
    )
    assert ready.status_code == 200 and ready.json()["ready"] is True
    # max_batch_size: what one request may carry (max_images_per_request); the batcher's own choice
    # (issue 15 G) is dynamic_batching's preferred_batch_size.
    assert config["max_batch_size"] == 32 and config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
    assert config["input"] == [
        {"name": "pixel_values", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [1, 8, 8]}
    ]
    assert config["output"] == [
        {"name": "logits", "data_type": "TYPE_FP32", "dims": [10]},
        {"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]},
    ]


async def test_json_infer_equals_v1_classify_on_the_same_tensor() -> None:
    x = digit_tensor(DIGIT_7)
    async with running_app() as client:
        v1 = (
            await client.post("/v1/models/vit-digits/classify", files={"image": DIGIT_7}, params={"top_k": 10})
        ).json()
        response = await client.post(INFER, json=json_request(x, id="req-1"))
        # "outputs": [] asks for none in particular: every output, as Triton answers (a reviewer's find:
        # it ran the model and returned nothing)
        empty = await client.post(INFER, json=json_request(x, id="req-1", outputs=[]))
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["model_name"] == "vit-digits" and body["model_version"] == "1" and body["id"] == "req-1"
    assert [o["name"] for o in body["outputs"]] == ["logits", "embedding"]  # every output unless some are asked for
    assert empty.json() == body
    output = body["outputs"][0]
    assert output["name"] == "logits" and output["datatype"] == "FP32" and output["shape"] == [1, 10]
    logits = np.asarray(output["data"], np.float32).reshape(1, 10)
    predictions = classify(logits[0], MANIFEST.labels, 10)
    assert [p["class_id"] for p in predictions] == [p["class_id"] for p in v1["predictions"]]
    assert predictions[0]["label"] == "7"
    np.testing.assert_allclose([p["score"] for p in predictions], [p["score"] for p in v1["predictions"]], atol=1e-6)


async def test_binary_infer_equals_json_and_rows_equal_single_requests() -> None:
    blank = png_bytes(np.zeros((8, 8), np.uint8))
    x = digit_tensor(DIGIT_7, blank, DIGIT_7)
    async with running_app() as client:
        as_json = (await client.post(INFER, json=json_request(x))).json()
        body, headers = binary_request(x, {"parameters": {"binary_data_output": True}})
        binary = await client.post(INFER, content=body, headers=headers)
        singles = [(await client.post(INFER, json=json_request(x[i : i + 1]))).json() for i in range(3)]
    assert binary.status_code == 200 and binary.headers["content-type"] == "application/octet-stream"
    logits = read_binary_response(binary)["logits"]
    json_logits = np.asarray(as_json["outputs"][0]["data"], np.float32).reshape(3, 10)
    np.testing.assert_array_equal(logits, json_logits)  # float32 survives JSON exactly
    single_logits = np.concatenate([np.asarray(s["outputs"][0]["data"], np.float32)[None] for s in singles])
    np.testing.assert_allclose(logits, single_logits, atol=1e-5)
    np.testing.assert_array_equal(logits[0], logits[2])
    assert np.argmax(logits[0]) == 7


async def test_per_output_binary_flag_and_gzip_request_body() -> None:
    x = digit_tensor(DIGIT_7)
    body, headers = binary_request(x, {"outputs": [{"name": "logits", "parameters": {"binary_data": False}}]})
    async with running_app() as client:
        json_out = await client.post(INFER, content=body, headers=headers)  # binary in, JSON out
        gzipped = await client.post(INFER, content=gzip.compress(body), headers={**headers, "Content-Encoding": "gzip"})
        deflated = await client.post(
            INFER,
            content=zlib.compress(orjson.dumps(json_request(x, outputs=[{"name": "logits"}]))),
            headers={"Content-Encoding": "deflate"},
        )
    assert json_out.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in json_out.headers
    assert gzipped.json() == deflated.json() == json_out.json()


async def test_a_content_encoding_sent_twice_is_read_as_one_list() -> None:
    # Found by a tester: "identity" then "gzip" was read as "identity", and the gzip bytes as JSON (400).
    # The two are one list (RFC 9110, Sec. 5.3), "identity, gzip", which is gzip.
    body = gzip.compress(orjson.dumps(json_request(digit_tensor(DIGIT_7))))
    async with running_app() as client:
        twice = await client.post(
            INFER, content=body, headers=[("content-encoding", "identity"), ("content-encoding", "gzip")]
        )
        listed = await client.post(INFER, content=body, headers={"Content-Encoding": "identity, gzip"})
    assert twice.status_code == listed.status_code == 200  # gzip, as the body is: identity is no coding
    assert twice.json() == listed.json()


async def test_a_gzip_body_of_several_members_is_whole_and_bytes_after_a_stream_are_refused() -> None:
    # Found by a fresh user: a body of two gzip members (RFC 1952, Sec. 2.2) was cut after the first
    # (400, "not valid JSON"), and garbage after a gzip or deflate stream was silently dropped (200).
    from service.core.errors import BadRequest
    from service.v2.protocol import MAX_GZIP_MEMBERS, inflate

    document = orjson.dumps(json_request(digit_tensor(DIGIT_7)))
    half = len(document) // 2
    members = gzip.compress(document[:half]) + gzip.compress(document[half:])
    assert inflate(members, "gzip", 10**6) == document
    with pytest.raises(BadRequest, match="7 bytes after its end of stream"):
        inflate(gzip.compress(document) + b"garbage", "gzip", 10**6)
    with pytest.raises(BadRequest, match="after its end of stream"):
        inflate(zlib.compress(document) + zlib.compress(b" "), "deflate", 10**6)  # deflate has no members
    with pytest.raises(BadRequest, match=f"more than {MAX_GZIP_MEMBERS} members"):
        inflate(gzip.compress(document) + gzip.compress(b" ") * MAX_GZIP_MEMBERS, "gzip", 10**6)
    async with running_app() as client:
        whole = await client.post(INFER, content=members, headers={"Content-Encoding": "gzip"})
        plain = await client.post(INFER, content=document)
        trailing = await client.post(
            INFER, content=gzip.compress(document) + b"x", headers={"Content-Encoding": "gzip"}
        )
    assert whole.status_code == 200 and whole.json() == plain.json()
    assert trailing.status_code == 400 and "after its end of stream" in trailing.json()["error"]


async def test_classification_extension_returns_top_k_as_bytes() -> None:
    x = digit_tensor(DIGIT_7)
    async with running_app() as client:
        raw = (await client.post(INFER, json=json_request(x))).json()["outputs"][0]["data"]
        response = await client.post(
            INFER, json=json_request(x, outputs=[{"name": "logits", "parameters": {"classification": 3}}])
        )
        body, headers = binary_request(
            x, {"outputs": [{"name": "logits", "parameters": {"classification": 2, "binary_data": True}}]}
        )
        binary = await client.post(INFER, content=body, headers=headers)
    (output,) = response.json()["outputs"]
    assert output["datatype"] == "BYTES" and output["shape"] == [1, 3]
    order = np.argsort(-np.asarray(raw), kind="stable")[:3]
    assert output["data"] == [f"{raw[i]:f}:{i}:{MANIFEST.labels[i]}" for i in order]
    assert output["data"][0].split(":")[1:] == ["7", "7"]
    length = int(binary.headers["inference-header-content-length"])
    data = binary.content[length:]
    elements = []
    while data:
        (n,) = struct.unpack("<I", data[:4])
        elements.append(data[4 : 4 + n].decode())
        data = data[4 + n :]
    assert elements == output["data"][:2]


async def test_classification_of_an_output_that_is_not_b_by_n_is_refused_before_the_model_runs() -> None:
    # a tester's: vit-cifar10's attentions (B, depth, heads, T, T) with classification ran all 8 rows, then the 400
    from tests.service.helpers import sample

    x = np.zeros((8, 3, 32, 32), np.float32)
    outputs = [{"name": "logits"}, {"name": "attentions", "parameters": {"classification": 3}}]
    async with running_app() as client:
        before = (await client.get("/metrics")).text
        response = await client.post("/v2/models/vit-cifar10/infer", json=json_request(x, outputs=outputs))
        after = (await client.get("/metrics")).text
    assert_error(response, 400, "output 'attentions' has shape [-1, ")
    assert "classification needs (B, N)" in response.json()["error"]
    assert sample(after, "patchserve_batches_total", model="vit-cifar10", version="3") == sample(
        before, "patchserve_batches_total", model="vit-cifar10", version="3"
    )


async def test_classification_of_an_output_of_unknown_rank_runs_and_is_checked_after(monkeypatch) -> None:
    # a reviewer's: ONNX Runtime gives [] for an output whose rank it cannot infer, as for a scalar
    from service.v2 import tensor_inference

    known = tensor_inference.output_specs
    monkeypatch.setattr(tensor_inference, "output_specs", lambda m: [(n, t, []) for n, t, _ in known(m)])
    outputs = [{"name": "logits", "parameters": {"classification": 2}}]
    async with running_app() as client:
        response = await client.post(INFER, json=json_request(digit_tensor(DIGIT_7), outputs=outputs))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 2]


async def test_bad_requests_are_protocol_errors_never_500() -> None:
    x = digit_tensor(DIGIT_7)
    good = json_request(x)

    def with_input(**changes: object) -> dict:
        return {"inputs": [{**good["inputs"][0], **changes}]}

    async with running_app(max_images_per_request=4, max_body_bytes=64 * 1024) as client:
        post = client.post
        assert_error(await post("/v2/models/nope/infer", json=good), 404, "nope")
        assert_error(await post("/v2/models/vit-digits/versions/9/infer", json=good), 404, "version")
        assert_error(await post(INFER, content=b"{not json"), 400, "not valid JSON")
        assert_error(await post(INFER, content=b""), 400)
        assert_error(await post(INFER, json=[1, 2]), 400, "object")
        assert_error(await post(INFER, json={"inputs": []}), 400, "inputs")
        assert_error(await post(INFER, json=with_input(name="image")), 400, "'pixel_values'")
        assert_error(await post(INFER, json=with_input(datatype="FP64")), 400, "FP32")
        assert_error(await post(INFER, json=with_input(datatype="BYTES")), 400, "BYTES")
        assert_error(await post(INFER, json=with_input(datatype="FLOAT")), 400, "datatype")
        # a fresh user's follow-up: no datatype said "unknown datatype None"; a list or an object was a 500
        assert_error(await post(INFER, json=with_input(datatype=None)), 400, "'pixel_values': no datatype; one of")
        assert_error(await post(INFER, json=with_input(datatype=[1])), 400, "unknown datatype '[1]'")
        assert_error(await post(INFER, json=with_input(datatype={"a": 1})), 400, "unknown datatype")
        assert_error(await post(INFER, json=with_input(shape=[1, 1, 8, 9], data=[0.0] * 72)), 400, "[-1, 1, 8, 8]")
        assert_error(
            await post(INFER, json=with_input(shape=[1, 64])), 400, "(-1: any size >= 1)"
        )  # as every shape error
        # a fresh user's: one version was quoted and the other not
        conflict = await post("/v2/models/vit-digits/versions/1/infer?version=2", json=good)
        assert_error(conflict, 400, "the path asks for version '1' and ?version= for '2'")
        assert_error(await post(INFER, json=with_input(shape=[1, 1, 8, -8])), 400, "non-negative")
        assert_error(await post(INFER, json=with_input(shape=[2, 1, 8, 8])), 400, "64 elements")
        assert_error(await post(INFER, json=with_input(data=["a"] * 64)), 400, "FP32")
        assert_error(await post(INFER, json=with_input(data=[[1.0], [1.0, 2.0]])), 400)
        # JSON null and booleans are not numbers (numpy would read them as NaN and 1.0).
        assert_error(await post(INFER, json=with_input(data=[None] * 64)), 400, "must all be numbers")
        assert_error(await post(INFER, json=with_input(data=[True] * 64)), 400, "must all be numbers")
        assert_error(await post(INFER, json=with_input(data=[0.5] * 63 + [None])), 400, "must all be numbers")
        assert (await post(INFER, json=with_input(data=[0] * 64))).status_code == 200  # JSON integers are numbers
        zeros = np.zeros((0, 1, 8, 8), np.float32)
        assert_error(await post(INFER, json=json_request(zeros)), 400, "batch size")
        five = np.zeros((5, 1, 8, 8), np.float32)
        assert_error(await post(INFER, json=json_request(five)), 400, "between 1 and 4")
        unknown_output = {**good, "outputs": [{"name": "boxes"}]}
        assert_error(await post(INFER, json=unknown_output), 400, "no output 'boxes'")
        shm = with_input(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 256})
        assert_error(await post(INFER, json=shm), 400, "shared-memory")

        body, headers = binary_request(x)
        assert_error(await post(INFER, content=body[:-4], headers=headers), 400, "ends before")
        assert_error(await post(INFER, content=body + b"\0" * 4, headers=headers), 400, "unclaimed")
        assert_error(await post(INFER, content=body, headers={"Inference-Header-Content-Length": "-3"}), 400)
        too_long = {"Inference-Header-Content-Length": str(len(body) + 1)}
        assert_error(await post(INFER, content=body, headers=too_long), 400, "Inference-Header-Content-Length")
        assert_error(await post(INFER, content=body, headers={**headers, "Content-Encoding": "br"}), 415, "br")
        assert_error(await post(INFER, content=b"\x1f\x8b junk", headers={"Content-Encoding": "gzip"}), 400)
        # a gzip header cut short by garbage: zlib waits for more, so it may be cut or corrupt (a fresh user's find)
        garbage = b"\x1f\x8b\x08\x00garbage"
        assert_error(
            await post(INFER, content=garbage, headers={"Content-Encoding": "gzip"}), 400, "truncated or corrupt"
        )
        bomb = gzip.compress(b" " * (1024 * 1024))
        assert_error(await post(INFER, content=bomb, headers={"Content-Encoding": "gzip"}), 413)
        assert_error(await post(INFER, content=b"\0" * (65 * 1024)), 413)
        assert_error(await client.get("/v2/models/vit-digits/infer"), 405, "use POST")
        assert_error(await client.get("/v2/models/nope/ready"), 404)
        assert_error(await client.get("/v2/models/nope/config"), 404)
        assert_error(await client.get("/v2/repository/index"), 405, "use POST")  # the path exists, for POST


async def test_deadlines_from_the_timeout_parameter_and_header_are_504s() -> None:
    x = digit_tensor(DIGIT_7)
    async with running_app() as client:
        # Triton's request-level timeout, in microseconds: 1 us has passed before the row is queued.
        expired = await client.post(INFER, json=json_request(x, parameters={"timeout": 1}))
        generous = await client.post(INFER, json=json_request(x, parameters={"timeout": 10_000_000}))
        by_header = await client.post(INFER, json=json_request(x), headers={"X-Request-Timeout": "0.000001"})
        bad = await client.post(INFER, json=json_request(x, parameters={"timeout": -5}))
        huge = await client.post(INFER, json=json_request(x, parameters={"timeout": 10**30}))  # an integer literal
        just_past = [  # a tester's: 2**63 … 2**64 - 1 still read as integers and were taken
            await client.post(INFER, json=json_request(x, parameters={"timeout": t})) for t in (2**63, 2**64 - 1)
        ]
        bad_header = await client.post(INFER, json=json_request(x), headers={"X-Request-Timeout": "soon"})
        bad_query = await client.post(INFER, json=json_request(x), params={"timeout": "0"})
        metrics = (await client.get("/metrics")).text
    assert_error(expired, 504, "deadline")
    assert generous.status_code == 200
    assert_error(by_header, 504, "deadline")
    assert_error(bad, 400, "timeout")
    # A fresh user's: 10**30 read as the float 1e+30, and the 400 called an integer "not an integer".
    assert_error(huge, 400, "below 2**63 (JSON numbers beyond it read as floats)")
    for refused in just_past:
        assert_error(refused, 400, "below 2**63")
    # Found by a fresh user: the 400 said only "Input should be a valid number" and named nothing.
    assert_error(bad_header, 400, "header 'x-request-timeout': Input should be a valid number")
    assert_error(bad_query, 400, "query parameter 'timeout': Input should be greater than 0")
    assert 'patchserve_requests_total{model="vit-digits",outcome="timeout",version="1"}' in metrics


async def test_not_ready_is_a_4xx_and_infer_waits_for_loading() -> None:
    from service.http.app import create_app
    from tests.conftest import make_settings

    app = create_app(make_settings())
    import httpx

    transport = httpx.ASGITransport(app=app)  # no lifespan: the models are never loaded
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/v2/health/live")).status_code == 200
        assert_error(await client.get("/v2/health/ready"), 400, "loading")
        assert_error(await client.get("/v2/models/vit-digits/ready"), 400, "loading")
        response = await client.post(INFER, json=json_request(digit_tensor(DIGIT_7)))
    assert_error(response, 503, "loading")
    assert response.headers["retry-after"]


async def test_probes_pass_a_full_worker_and_a_late_body_is_a_protocol_408() -> None:
    from tests.service.helpers import HeldRequest, until

    # The slot is held until the test releases it (no race with a body timeout on a busy machine).
    async with running_app(max_in_flight=1, body_timeout=60.0) as client:
        held = HeldRequest(client.app, INFER)
        await until(lambda: held.body_reads >= 1)
        refused = await client.post(INFER, json=json_request(digit_tensor(DIGIT_7)))
        probes = [await client.get(p) for p in ("/v2/health/live", "/v2/health/ready")]
        still_held = not held.task.done()
        held.release()
        await asyncio.wait_for(held.task, 10)
    assert still_held and refused.status_code == 503
    assert [r.status_code for r in probes] == [200, 200]
    async with running_app(body_timeout=0.2) as client:
        late = HeldRequest(client.app, INFER)  # its body never comes
        await asyncio.wait_for(late.task, 10)
    assert late.status == 408 and late.headers["connection"] == "close"
    assert late.headers["content-type"] == "application/json" and "PATCHSERVE_BODY_TIMEOUT" in late.body["error"]


async def test_a_batch_over_the_queue_is_refused_whole_and_probes_need_no_key() -> None:
    x = digit_tensor(DIGIT_7, DIGIT_7, DIGIT_7)
    async with running_app(queue_size=2) as client:
        refused = await client.post(INFER, json=json_request(x))
        fits = await client.post(INFER, json=json_request(x[:2]))
        config = (await client.get("/v2/models/vit-digits/config")).json()
    # More rows than the whole queue can never be admitted: a 400, not a 503 tritonclient retries forever.
    assert_error(refused, 400, "admits at most 2 rows in one request (its queue_size); this one has 3")
    assert "retry-after" not in refused.headers and fits.status_code == 200
    assert config["max_batch_size"] == 2  # what one request may carry, the queue's size included
    async with running_app(api_keys=["k-1"]) as client:
        probes = [(await client.get(p)).status_code for p in ("/v2/health/live", "/v2/health/ready")]
        metadata = await client.get("/v2/models/vit-digits")
        with_key = await client.get("/v2/models/vit-digits", headers={"Authorization": "Bearer k-1"})
    assert probes == [200, 200] and metadata.status_code == 401 and with_key.status_code == 200


async def test_a_huge_version_is_a_404_and_never_reaches_int() -> None:
    # Issue 15 D: int() refuses 4,300 digits and more (CVE-2020-10735); a version has at most 9.
    huge = "1" * 5000
    x = digit_tensor(DIGIT_7)
    async with running_app() as client:
        for path in ("", "/ready", "/config"):
            assert_error(await client.get(f"/v2/models/vit-digits/versions/{huge}{path}"), 404, "no version")
        infer = await client.post(f"/v2/models/vit-digits/versions/{huge}/infer", json=json_request(x))
        v1 = await client.post("/v1/models/vit-digits/classify", params={"version": huge}, files={"image": DIGIT_7})
        ten_digits = await client.get("/v2/models/vit-digits/versions/0000000001")
        nine_digits = await client.get("/v2/models/vit-digits/versions/000000001")
    assert_error(infer, 404, "5000 characters")
    assert v1.status_code == 422  # /v1's query pattern, as before
    assert ten_digits.status_code == 404 and nine_digits.status_code == 200


async def test_a_huge_version_is_a_503_when_admission_refuses_it() -> None:
    from tests.service.helpers import HeldRequest, until

    huge = "1" * 5000
    # The slot is held until the test releases it (no race with a body timeout on a busy machine).
    async with running_app(max_in_flight=1, body_timeout=60.0) as client:
        held = HeldRequest(client.app, INFER)
        await until(lambda: held.body_reads >= 1)
        v1 = await client.post("/v1/models/vit-digits/classify", params={"version": huge}, files={"image": DIGIT_7})
        v2 = await client.post(f"/v2/models/vit-digits/versions/{huge}/infer", json={})
        still_held = not held.task.done()
        held.release()
        await asyncio.wait_for(held.task, 10)
    assert still_held and v1.status_code == 503 and v1.headers["content-type"] == "application/problem+json"
    assert_error(v2, 503, "PATCHSERVE_MAX_IN_FLIGHT")  # the protocol's error, which tritonclient reads


@pytest.mark.parametrize("binary", [False, True])
async def test_a_zero_element_tensor_with_huge_dimensions_is_a_400(binary: bool) -> None:
    # Issue 15 E: numpy cannot represent shape [0, 2**63] ("Maximum allowed dimension exceeded").
    shapes = ([0, 2**63 - 1], [0, 2**62, 2**62], [0, 1, 2**40, 8], [1] * 65)
    async with running_app() as client:
        for shape in shapes:
            entry = {"name": "pixel_values", "shape": shape, "datatype": "FP32"}
            if binary:
                header = orjson.dumps({"inputs": [{**entry, "parameters": {"binary_data_size": 0}}]})
                response = await client.post(
                    INFER, content=header, headers={"Inference-Header-Content-Length": str(len(header))}
                )
            else:
                response = await client.post(INFER, json={"inputs": [{**entry, "data": []}]})
            assert_error(response, 400, "pixel_values")
        long_header = await client.post(INFER, content=b"{}", headers={"Inference-Header-Content-Length": "9" * 5000})
        superscript_two = {"Inference-Header-Content-Length": "\u00b2".encode("latin-1")}  # isdigit(), not int()
        digit_header = await client.post(INFER, content=b"{}", headers=superscript_two)
    assert_error(long_header, 400, "Inference-Header-Content-Length")
    assert_error(digit_header, 400, "Inference-Header-Content-Length")


async def test_non_finite_inputs_are_run_as_triton_runs_them_and_json_stays_valid() -> None:
    # Issue 15 G: perf_analyzer's default data is random bytes (NaN, inf in FP32); Triton runs them.
    x = digit_tensor(DIGIT_7, DIGIT_7)
    x[0, 0, 0, 0], x[0, 0, 0, 1] = np.nan, np.inf
    async with running_app() as client:
        body, headers = binary_request(x, {"parameters": {"binary_data_output": True}})
        as_binary = await client.post(INFER, content=body, headers=headers)
        clean = await client.post(INFER, json=json_request(x[1:]))
    assert as_binary.status_code == 200, as_binary.text
    logits = read_binary_response(as_binary)["logits"]
    assert np.isnan(logits[0]).all()  # NaN spreads through the row's attention...
    expected = np.asarray(clean.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(logits[1], expected, rtol=1e-5, atol=1e-5)  # ...and never to its batch mate
    async with running_app() as client:
        overflow_json = await client.post(
            INFER,
            content=b'{"inputs": [{"name": "pixel_values", "shape": [1, 1, 8, 8], "datatype": "FP32", '
            b'"data": [1e39' + b", 0.5" * 63 + b"]}]}",
        )
        # What tritonclient's set_data_from_numpy(x, binary_data=False) sends for a NaN: a bare literal.
        literal_json = await client.post(
            INFER,
            content=b'{"inputs": [{"name": "pixel_values", "shape": [2, 1, 8, 8], "datatype": "FP32", '
            b'"data": [NaN, Infinity, -Infinity'
            + b", 0.5" * 61
            + b"".join(b", %r" % v for v in x[1].ravel().tolist())
            + b"]}]}",
        )
    for response in (overflow_json, literal_json):
        assert response.status_code == 200 and response.headers["content-type"] == "application/json", response.text
    # NaN outputs are written as Triton writes them (rapidjson's NaN literal), which json.loads reads.
    data = json.loads(overflow_json.content)["outputs"][0]["data"]
    assert len(data) == 10 and all(math.isnan(v) for v in data)
    assert b"null" not in overflow_json.content and b"NaN" in overflow_json.content
    rows = np.asarray(json.loads(literal_json.content)["outputs"][0]["data"], np.float32).reshape(2, 10)
    assert np.isnan(rows[0]).all()  # the literals were read as NaN and infinities and run...
    np.testing.assert_allclose(rows[1], expected, rtol=1e-5, atol=1e-5)  # ...and the clean row is unchanged


async def test_v2_405_404_401_are_protocol_errors_with_the_right_allow() -> None:
    # Issue 15 G: tritonclient reads {"error": ...}; problem+json made it report "'error'".
    async with running_app(api_keys=["k-1"]) as client:
        unauthorized = await client.get("/v2/models/vit-digits")
        key = {"Authorization": "Bearer k-1"}
        options = await client.options("/v2/health/live", headers=key)
        put = await client.put("/v2/health/live", headers=key)
        post_meta = await client.post("/v2", headers=key)
        get_infer = await client.get(INFER, headers=key)
        nowhere = await client.put("/v2/nowhere", headers=key)
        v1_put = await client.put("/v1/models", headers=key)
    assert_error(unauthorized, 401, "API key")
    assert unauthorized.headers["www-authenticate"] == "Bearer"
    for response, allow in ((options, "GET, HEAD"), (put, "GET, HEAD"), (post_meta, "GET, HEAD"), (get_infer, "POST")):
        assert_error(response, 405, "not allowed")
        assert response.headers["allow"] == allow
    assert_error(nowhere, 404, "no such endpoint")
    assert v1_put.status_code == 405 and v1_put.headers["content-type"] == "application/problem+json"
    assert v1_put.headers["allow"] == "GET, HEAD"


async def test_config_reports_the_sessions_and_what_a_request_may_carry() -> None:
    x = digit_tensor(*[DIGIT_7] * 5)
    async with running_app(instances=2, max_batch_size=2, max_images_per_request=5) as client:
        config = (await client.get("/v2/models/vit-digits/config")).json()
        five = await client.post(INFER, json=json_request(x))
        six = await client.post(INFER, json=json_request(np.concatenate([x, x[:1]])))
    assert config["instance_group"][0]["count"] == 2
    assert config["max_batch_size"] == 5 and config["dynamic_batching"]["preferred_batch_size"] == [2]
    assert five.status_code == 200 and five.json()["outputs"][0]["shape"] == [5, 10]
    assert_error(six, 400, "between 1 and 5")


@pytest.mark.parametrize(
    ("datatype", "data", "problem"),
    [
        ("UINT8", [0, 255, -1], "outside [0, 255]"),
        ("INT8", [128, 0, 0], "outside [-128, 127]"),
        ("INT32", [1e10, 0, 0], "outside"),
        ("BOOL", [1, 0, 1], "true or false"),
        ("FP16", ["1", 0, 0], "must all be numbers"),
        ("INT64", [None, 1, 2], "must all be numbers"),
        ("INT64", [1.9, 1, 2], "a value is not an integer"),  # not truncated to 1
        ("INT64", [1, 2, 2**63], "outside [-9223372036854775808, 9223372036854775807]"),  # numpy: floats
        ("UINT64", [-1, 0, 2**63], "outside [0, 18446744073709551615]"),
        ("FP32", [[1.0, 2.0], [3.0]], "its nested lists are ragged"),  # not numpy's "inhomogeneous shape"
        ("FP32", [0.5, 1.0, True], "must all be numbers"),  # numpy reads it as [0.5, 1.0, 1.0]
        ("INT32", [[0], [False], [2]], "must all be numbers"),  # and this as [[0], [0], [2]]
    ],
)
def test_json_data_out_of_its_datatype_is_a_400_never_a_silent_cast(datatype: str, data: list, problem: str) -> None:
    from service.core.errors import BadRequest
    from service.v2.protocol import parse_infer_request

    def request(values: list) -> bytes:
        return orjson.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": datatype, "data": values}]})

    with pytest.raises(BadRequest, match=re.escape(problem)):
        parse_infer_request(request(data), None)
    for value, shown in ((1e30, "1e+30"), ("5", "'5'")):
        timeout = orjson.dumps({"inputs": orjson.loads(request(data))["inputs"], "parameters": {"timeout": value}})
        with pytest.raises(
            BadRequest,
            match=re.escape(f"microseconds below 2**63 (JSON numbers beyond it read as floats), not {shown}"),
        ):
            parse_infer_request(timeout, None)
    fine = {
        "UINT8": [0, 255, 7],
        "INT8": [-128, 127, 0],
        "INT32": [1, -2, 3],
        "BOOL": [True, False, True],
        "INT64": [-(2**63), 2**63 - 1, 0],
        "UINT64": [0, 2**64 - 1, 2],
    }
    if datatype in fine:
        parsed = parse_infer_request(request(fine[datatype]), None)
        assert parsed.inputs["x"].tolist() == fine[datatype]


def test_json_data_takes_tritons_nan_and_infinity_literals_and_nothing_more() -> None:
    # tritonclient's JSON data for a NaN is a bare NaN literal, which Triton's parser reads; orjson does not.
    from service.core.errors import BadRequest
    from service.v2.protocol import parse_infer_request

    def request(data: bytes, request_id: bytes = b'"r"') -> bytes:
        entry = b'{"name": "x", "shape": [4], "datatype": "FP32", "data": ' + data + b"}"
        return b'{"id": ' + request_id + b', "inputs": [' + entry + b"]}"

    parsed = parse_infer_request(request(b"[NaN, Infinity, -Infinity, 1.5]"), None)
    x = parsed.inputs["x"]
    assert x.dtype == np.float32 and np.isnan(x[0]) and x[1] == np.inf and x[2] == -np.inf and x[3] == 1.5
    assert parsed.id == "r"
    for bad in (
        request(b"[NaN, 1, 2, 3,]"),  # still not JSON with the literals
        request(b"[nan, 1, 2, 3]"),  # only Triton's spelling
        request(b"[NaN, 1, 2, 3]", b'"\\ud800"'),  # a lone surrogate orjson refuses stays refused
        request(b"[NaN, 1, 2, 3]", b"18446744073709551616" * 2),  # past 64 bits
        request(b"[NaN, 1, 2, 3]").decode().encode("utf-16"),  # json.loads alone would guess UTF-16
    ):
        with pytest.raises(BadRequest, match="not valid JSON"):
            parse_infer_request(bad, None)
    png = (ROOT / "examples" / "digit-7.png").read_bytes()  # binary without its header length, as a fresh user sent
    with pytest.raises(BadRequest, match=r"not UTF-8 text .*needs the Inference-Header-Content-Length header"):
        parse_infer_request(png, None)
    with pytest.raises(BadRequest, match="not valid JSON") as bom:  # UTF-8 with a BOM is text: no binary hint
        parse_infer_request(b"\xef\xbb\xbf" + request(b"[1, 2, 3, 4]"), None)
    assert "Inference-Header-Content-Length" not in str(bom.value)


def test_json_outputs_write_non_finite_values_as_triton_does_and_finite_ones_unchanged() -> None:
    from service.v2.protocol import OutputTensor, encode_infer_response

    finite = np.asarray([[0.1, -2.5], [3.0, 1e-7]], np.float32)
    odd = np.asarray([np.nan, np.inf, -np.inf, 0.1], np.float16)
    ints = np.asarray([1, 2], np.int64)
    outputs = [OutputTensor(name, array, False) for name, array in (("finite", finite), ("odd", odd), ("ints", ints))]
    body, headers = encode_infer_response("m", "1", "patchserve-data-0", outputs)
    assert headers == {"Content-Type": "application/json"}
    assert b'"data":[NaN,Infinity,-Infinity,0.099975586]' in body  # the literals rapidjson writes
    document = json.loads(body)  # what tritonclient reads it with (python-rapidjson) reads it alike
    assert document["id"] == "patchserve-data-0"
    assert np.asarray(document["outputs"][0]["data"], np.float32).tolist() == finite.ravel().tolist()
    values = document["outputs"][1]["data"]
    assert math.isnan(values[0]) and values[1:3] == [math.inf, -math.inf] and np.float16(values[3]) == odd[3]
    assert document["outputs"][2]["data"] == [1, 2]
    clean, _ = encode_infer_response("m", "1", None, [OutputTensor("finite", finite, False)])
    assert b"NaN" not in clean and orjson.loads(clean)["outputs"][0]["data"] == orjson.loads(
        orjson.dumps(finite.ravel(), option=orjson.OPT_SERIALIZE_NUMPY)
    )  # the fast path, unchanged: strict JSON


async def test_tritonclients_own_json_request_with_nan_is_run_and_its_nan_output_read_back() -> None:
    # The body tritonclient builds for set_data_from_numpy(x, binary_data=False) with a NaN in x,
    # and its own parser on the answer: the NaN row gives NaN logits, its batch mate its own.
    import tritonclient.http as triton

    x = digit_tensor(DIGIT_7, DIGIT_7)
    x[0, 0, 0, 0] = np.nan
    tensor = triton.InferInput("pixel_values", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    requested = [triton.InferRequestedOutput("logits", binary_data=False)]
    body, header_length = triton.InferenceServerClient.generate_request_body([tensor], requested)
    assert header_length is None and b"NaN" in body
    async with running_app() as client:
        response = await client.post(INFER, content=body)
        clean = await client.post(INFER, json=json_request(x[1:]))
    assert response.status_code == 200, response.text
    logits = triton.InferenceServerClient.parse_response_body(response.content).as_numpy("logits")
    assert logits.shape == (2, 10) and np.isnan(logits[0]).all()
    expected = np.asarray(clean.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(logits[1], expected, rtol=1e-5, atol=1e-5)


def test_a_float_beyond_its_datatype_becomes_infinity_without_a_warning() -> None:
    from service.v2.protocol import parse_infer_request

    body = b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1e308, -1e39, 0.5]}]}'
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" would raise
        parsed = parse_infer_request(body, None)
    assert parsed.inputs["x"].tolist() == [np.inf, -np.inf, 0.5]


async def test_an_input_with_both_json_data_and_binary_data_size_is_a_400() -> None:
    # Found by a fresh user: the binary data silently won; Triton refuses the input (set_count != 1).
    x = digit_tensor(DIGIT_7)
    raw = x.astype("<f4").tobytes()
    entry = {"name": "pixel_values", "shape": [1, 1, 8, 8], "datatype": "FP32"}
    both = {**entry, "data": (x * 0).ravel().tolist(), "parameters": {"binary_data_size": len(raw)}}
    header = orjson.dumps({"inputs": [both]})
    async with running_app() as client:
        response = await client.post(
            INFER, content=header + raw, headers={"Inference-Header-Content-Length": str(len(header))}
        )
        only_binary = await client.post(INFER, content=binary_request(x)[0], headers=binary_request(x)[1])
        null = {**both, "parameters": {"binary_data_size": None}}  # a tester: it was called "both" too
        null_size = await client.post(INFER, json={"inputs": [null]})
    assert_error(response, 400, "input 'pixel_values' has both data and parameters.binary_data_size")
    assert only_binary.status_code == 200  # either alone is served
    assert_error(null_size, 400, "input 'pixel_values': binary_data_size is null; give its binary data's size")


def test_a_body_of_more_arrays_than_a_request_needs_is_refused_before_it_is_parsed(monkeypatch) -> None:
    from service.core import json_bounds
    from service.core.errors import BadRequest
    from service.v2 import literals
    from service.v2.protocol import parse_infer_request

    nested = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)  # 1 + 2 + 6 + 24 = 33 arrays
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [2, 3, 4, 5], "datatype": "FP32", "data": nested.tolist()}]})
    own = body.count(b"[") + body.count(b"{")  # 33 for the data, 4 for the document (and the shape)
    assert own == 37
    monkeypatch.setattr(literals, "V2_CONTAINERS", own)  # at the limit: parsed
    assert np.array_equal(parse_infer_request(body, None).inputs["x"], nested)

    def no_parse(_: bytes) -> None:
        raise AssertionError("parsed")

    monkeypatch.setattr(literals.orjson, "loads", no_parse)
    flood = b'{"inputs": [' + b"[]," * 40 + b"[]]}"
    with pytest.raises(BadRequest, match=r"holds 43 arrays and objects, more than 37 allowed; send each input's data"):
        parse_infer_request(flood, None)
    assert json_bounds.V2_CONTAINERS == 65_536
    # a second tester: members are counted too, for a model of any input size (no value bound applies)
    keys = b'{"inputs": []' + b"".join(b',"%x":0' % i for i in range(json_bounds.MEMBERS)) + b"}"
    with pytest.raises(BadRequest, match=r"holds about 4097 object members .* more than 4096 allowed; send each"):
        parse_infer_request(keys, None)


async def test_an_error_quoting_a_huge_client_string_is_cut() -> None:
    # Found by a tester: a 5 MB input name came back as a 5 MB 400.
    good = json_request(digit_tensor(DIGIT_7))
    named = {"inputs": [{**good["inputs"][0], "name": "n" * 50_000}]}
    async with running_app() as client:
        refused = await client.post(INFER, json=named)
        huge_top_k = "/v1/models/vit-digits/classify?top_k=" + "9" * 50_000
        v1 = await client.post(huge_top_k, files={"image": ("a.png", DIGIT_7)})
    error = refused.json()["error"]
    assert refused.status_code == 400 and "n" * 4000 in error and len(error) < 4200
    assert "… (cut: the detail was" in error
    assert v1.status_code == 422 and len(v1.text) < 10_000, v1.text[:300]


async def test_an_unknown_input_is_refused_naming_every_input_the_model_has() -> None:
    foo = {"inputs": [{"name": "foo", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
    async with running_app() as client:
        detr = await client.post("/v2/models/detr-digits/infer", json=foo)
        vit = await client.post(INFER, json=foo)
    # a tester: detr-digits' message left out its optional pixel_mask
    assert_error(detr, 400, "has no input 'foo'; its inputs are 'pixel_values' and 'pixel_mask'")
    assert_error(vit, 400, "has no input 'foo'; its input is 'pixel_values'")


async def test_more_values_than_a_fixed_size_input_takes_are_refused_before_parsing() -> None:
    # 20 MB of zeros stalled a worker 0.45 s while orjson parsed them: vit-digits takes at most
    # 32 rows of 1 x 8 x 8 values, so commas beyond that (and the fields' own) are refused unread.
    entry = {"name": "pixel_values", "shape": [1, 1, 8, 8], "datatype": "FP32"}
    flood = orjson.dumps({"inputs": [{**entry, "data": [0.0] * 4000}]})
    fits = orjson.dumps({"inputs": [{**entry, "shape": [32, 1, 8, 8], "data": [0.0] * 2048}]})
    async with running_app() as client:
        refused = await client.post(INFER, content=flood)
        served = await client.post(INFER, content=fits)
        detr = await client.post("/v2/models/detr-digits/infer", content=flood)  # a free size: no value bound
    assert_error(
        refused,
        400,
        "the JSON body has 4005 commas, more than the 3072 its values can take (2048 values and 1024 for its fields; "
        "counted before parsing); the model's input takes no more",
    )  # a tester's: it said "more than 2048", the bound without the fields' commas
    assert served.status_code == 200, served.text
    assert detr.status_code == 400 and "commas, more than" not in detr.text
