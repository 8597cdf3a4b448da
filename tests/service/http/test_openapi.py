"""The OpenAPI document declares what the server really accepts and answers; schemathesis proves it.

The fast tests check the declarations; the slow one runs schemathesis (examples, coverage,
fuzzing and stateful phases) against a real server, with and without API keys, and requires no
5xx (but the 504 a request's own tiny deadline earns) and no response outside the document:
undeclared status, content type, header or body.
(``positive_data_acceptance`` is not run: "any bytes" is a schema-valid image body that is
rightly a 415.) Run against the code before this document declared its problem responses,
schemathesis found an undeclared 400, 404 and 415 and a 422 served as problem+json but
documented as application/json.
"""

from __future__ import annotations

import base64
import os
import subprocess
import warnings
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT, running_app, server_process

pytestmark = pytest.mark.anyio
SCHEMATHESIS = ROOT / ".venv" / "bin" / "schemathesis"
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    ]
)
CLASSIFY = "/v1/models/{name}/classify"


async def _document() -> dict:
    async with running_app() as client:
        return (await client.get("/openapi.json")).json()


async def test_the_three_request_bodies_are_declared() -> None:
    body = (await _document())["paths"][CLASSIFY]["post"]["requestBody"]
    assert body["required"] is True
    content = body["content"]
    assert set(content) == {"multipart/form-data", "image/*", "application/octet-stream", "application/json"}
    assert content["multipart/form-data"]["schema"]["required"] == ["image"]
    assert content["image/*"]["schema"] == {"type": "string", "format": "binary"}
    assert content["application/json"]["schema"]["properties"]["images"]["items"]["contentEncoding"] == "base64"


async def test_numeric_parameters_keep_their_json_schema_bounds() -> None:
    # The underscore check (service/core/numbers.py) first wrapped the timeouts' float in a validator
    # inside the Optional: the bound came out as pydantic's "gt", not JSON Schema's exclusiveMinimum,
    # and schemathesis found schema-valid timeouts of 0 refused (CI, 2026-12-07).
    paths = (await _document())["paths"]
    classify = {p["name"]: p["schema"] for p in paths[CLASSIFY]["post"]["parameters"]}
    detect = {p["name"]: p["schema"] for p in paths["/v1/models/{name}/detect"]["post"]["parameters"]}
    for name in ("timeout", "x-request-timeout"):
        assert classify[name]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0}, classify[name]
    assert classify["top_k"]["minimum"] == 1 and detect["max_detections"]["minimum"] == 1
    assert (detect["threshold"]["minimum"], detect["threshold"]["maximum"]) == (0, 1)


async def test_every_status_is_declared_with_its_media_type() -> None:
    paths = (await _document())["paths"]
    responses = paths[CLASSIFY]["post"]["responses"]
    assert set(responses) == {"200", "400", "401", "404", "408", "413", "415", "422", "500", "503", "504"}
    assert set(responses["200"]["content"]) == {"application/json", "image/png"}  # render=png: the heat map
    for status in set(responses) - {"200"}:
        assert set(responses[status]["content"]) == {"application/problem+json"}, status
    assert "Retry-After" in responses["503"]["headers"] and "WWW-Authenticate" in responses["401"]["headers"]
    assert set(paths["/v1/models/{name}"]["get"]["responses"]) == {"200", "401", "404", "422", "503"}
    assert set(paths["/readyz"]["get"]["responses"]) == {"200", "503"}


async def test_the_documented_example_works_and_responses_match_their_schemas() -> None:
    document = await _document()
    operation = document["paths"][CLASSIFY]["post"]
    example = operation["requestBody"]["content"]["application/json"]["example"]
    assert len(base64.b64decode(example["images"][0])) > 0
    schema_200 = operation["responses"]["200"]["content"]["application/json"]["schema"]
    problem = operation["responses"]["415"]["content"]["application/problem+json"]["schema"]
    async with running_app() as client:
        one = await client.post("/v1/models/vit-digits/classify", json=example)
        several = await client.post("/v1/models/vit-digits/classify", json={"images": [*example["images"], "AAAA"]})
        bad = await client.post(
            "/v1/models/vit-digits/classify", content=b"junk", headers={"content-type": "image/png"}
        )
    assert one.status_code == several.status_code == 200 and bad.status_code == 415
    assert one.json()["predictions"][0]["label"] == "7"  # the example is the digit 7
    for body in (one.json(), several.json()):
        jsonschema.validate(body, schema_200)
    assert several.json()["results"][1]["status"] == 415
    jsonschema.validate(bad.json(), problem)


CONTROL = {"PATCHSERVE_MODEL_CONTROL_API": "true"}  # off by default: on, so that load and unload are fuzzed too


def _schemathesis(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        '[parameters]\n"path.name" = "vit-digits"\n"path.version" = "1"\n'  # reach past the 404 for unknown names
        # A 504 is the documented answer when a request's own deadline (?timeout= or
        # X-Request-Timeout, which schemathesis sets to values like 5e-324 s) passes before it is
        # computed; every other 5xx still fails the run.
        '[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "504"]\n'
        # v2 infer takes a model's raw tensor: no schema can say which shapes and element counts a
        # model takes, so most generated tensors are rightly 400s; every check still runs on them.
        '[[operations]]\ninclude-path-regex = "^/v2/models/.*/infer$"\nwarnings = false\n'
        # detect needs a detector ("path.name" above is a classifier, which detect refuses).
        '[[operations]]\ninclude-path-regex = "/detect$"\nparameters = {"path.name" = "detr-digits"}\n'
        # unload names a model that is not there (400): unloading vit-digits would turn every later
        # generated request for it into a 404, and the fuzzing of the other routes into nothing.
        '[[operations]]\ninclude-path-regex = "/unload$"\n'
        'parameters = {"path.name" = "no-such-model"}\nwarnings = false\n'
    )
    seed = ["--seed", "1"] if os.environ.get("CI") == "true" else []
    command = [str(SCHEMATHESIS), "--config-file", str(config), "run", url + "/openapi.json", "--checks", CHECKS]
    # One worker: with two, CPython 3.11's ast.parse, which hypothesis calls from both threads while
    # it builds strategies, intermittently fails ("AST constructor recursion depth mismatch").
    command += ["--max-examples", "60", "--workers", "1", *seed, *extra]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_response_outside_the_document(tmp_path: Path) -> None:
    with server_process(env=CONTROL) as (url, _):
        result = _schemathesis(url, tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "No issues found" in result.stdout


@pytest.mark.slow
def test_schemathesis_with_api_keys(tmp_path: Path) -> None:
    public = "/healthz,/readyz,/openapi.json"
    env = {"PATCHSERVE_API_KEYS": "st-key-1", "PATCHSERVE_AUTH_PUBLIC_PATHS": public, **CONTROL}
    with server_process(env=env) as (url, _):
        result = _schemathesis(url, tmp_path, "--header", "Authorization: Bearer st-key-1", "--max-examples", "20")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "No issues found" in result.stdout


async def test_every_operation_id_is_unique_and_head_still_answers() -> None:
    # api_route(methods=["GET", "HEAD"]) gave GET and HEAD one operationId (healthz_healthz_get),
    # which OpenAPI 3 forbids; FastAPI warned "Duplicate Operation ID" at every start.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI's duplicate-id UserWarning would raise
        async with running_app() as client:
            paths = (await client.get("/openapi.json")).json()["paths"]
            heads = {path: await client.head(path) for path in ("/healthz", "/readyz", "/metrics")}
    ids = [op["operationId"] for item in paths.values() for op in item.values() if isinstance(op, dict)]
    assert len(ids) > 10 and len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert set(paths[path]) == {"get", "head"}
    assert {path: r.status_code for path, r in heads.items()} == {"/healthz": 200, "/readyz": 200, "/metrics": 200}
    assert all(r.content == b"" for r in heads.values())
