"""API keys (401 problems, constant-time comparison, public paths) and CORS (off by default)."""

from __future__ import annotations

from hmac import compare_digest

import pytest

from service.core.settings import load_settings
from service.http.middleware import auth
from tests.conftest import ROOT, running_app
from tests.service.helpers import Chunks, assert_problem

pytestmark = pytest.mark.anyio
DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()
CLASSIFY = "/v1/models/vit-digits/classify"
KEYS = ["k1-7f3a9c", "k2-0b8e4d=="]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_without_keys_the_server_is_open() -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY, files={"image": DIGIT_7})
    assert response.status_code == 200 and "www-authenticate" not in response.headers


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "needs an API key: send the header Authorization: Bearer <key>"),
        (bearer("k1-7f3a9"), "the API key is not valid"),  # a prefix of a real key
        (bearer("k1-7f3a9c0"), "the API key is not valid"),  # a real key and more
        (bearer(""), "must be Bearer <key>"),
        ({"Authorization": "Basic azEtN2YzYTljOg=="}, "must be Bearer <key>"),
        ({"Authorization": KEYS[0]}, "must be Bearer <key>"),
    ],
)
async def test_a_missing_or_wrong_key_is_401(headers: dict[str, str], detail: str) -> None:
    body = Chunks(4)
    async with running_app(api_keys=KEYS) as client:
        response = await client.post(CLASSIFY, content=body, headers={"content-type": "image/png", **headers})
        listing = await client.get("/v1/models", headers=headers)
        unknown_route = await client.get("/no/such/route", headers=headers)
    problem = assert_problem(response, 401, detail)
    assert problem["type"] == "urn:patchserve:problem:unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert body.pulled == 0  # refused before the body was read
    assert_problem(listing, 401)
    assert_problem(unknown_route, 401)  # routes are not revealed to callers without a key


async def test_two_authorization_headers_are_400_whichever_holds_the_key() -> None:
    # Found by a fresh user: the first one counted (wrong then right: 401; right then wrong: 200)
    async with running_app(api_keys=KEYS) as client:
        for first, second in ((KEYS[0], "nope"), ("nope", KEYS[0]), (KEYS[0], KEYS[1])):
            headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
            response = await client.get("/v1/models", headers=headers)
            assert_problem(response, 400, "the request has 2 Authorization headers; send one")
        assert (await client.get("/v1/models", headers=bearer(KEYS[0]))).status_code == 200


@pytest.mark.parametrize("authorization", [f"Bearer {KEYS[0]}", f"bearer {KEYS[1]}", f"  BEARER   {KEYS[1]} "])
async def test_any_configured_key_is_accepted(authorization: str) -> None:
    async with running_app(api_keys=KEYS) as client:
        response = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers={"Authorization": authorization})
        listing = await client.get("/v1/models", headers={"Authorization": authorization})
    assert response.status_code == 200 and response.json()["predictions"][0]["label"] == "7"
    assert listing.status_code == 200


async def test_probes_and_metrics_are_public_by_default_and_by_setting() -> None:
    async with running_app(api_keys=KEYS) as client:
        public = [(await client.get(path)).status_code for path in ("/healthz", "/readyz", "/metrics")]
        docs = await client.get("/openapi.json")
    assert public == [200, 200, 200]
    assert_problem(docs, 401)
    async with running_app(api_keys=KEYS, auth_public_paths=["/readyz"]) as client:
        assert (await client.get("/readyz")).status_code == 200  # running_app polls it
        assert_problem(await client.get("/healthz"), 401)
        assert_problem(await client.get("/metrics"), 401)
        assert (await client.get("/metrics", headers=bearer(KEYS[0]))).status_code == 200


async def test_the_openapi_document_declares_the_bearer_scheme_when_keys_are_set() -> None:
    async with running_app(api_keys=KEYS, auth_public_paths=["/healthz", "/readyz", "/openapi.json"]) as client:
        document = (await client.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "One of the keys in PATCHSERVE_API_KEYS.",
    }
    assert document["paths"]["/v1/models/{name}/classify"]["post"]["security"] == [{"apiKey": []}]
    assert document["paths"]["/healthz"]["get"]["security"] == []


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return compare_digest(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    digests = [auth._digest(k.encode()) for k in ("first", "second-key", "a-much-longer-third-key")]
    for token, ok in [(b"first", True), (b"a-much-longer-third-key", True), (b"x", False), (b"first-and-more", False)]:
        calls.clear()
        assert (auth.check_bearer(b"Bearer " + token, digests) is None) is ok
        assert calls == [(32, 32)] * 3  # every key, fixed-length digests, whichever matched


def test_bad_keys_stop_start_up_without_showing_them(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("PATCHSERVE_API_KEYS", "good-key,has space-secret")
    with pytest.raises(SystemExit) as stop:
        load_settings()
    message = capsys.readouterr().err
    assert stop.value.code == 2 and "PATCHSERVE_API_KEYS" in message and "<hidden>" in message
    assert "secret" not in message and "good-key" not in message
    monkeypatch.setenv("PATCHSERVE_API_KEYS", "good-key, other-key")
    settings = load_settings()
    assert settings.api_keys == ["good-key", "other-key"] and "good-key" not in repr(settings)


async def test_cors_is_off_by_default() -> None:
    origin = {"Origin": "https://app.example"}
    preflight = {**origin, "Access-Control-Request-Method": "POST"}
    async with running_app() as client:
        response = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers=origin)
        options = await client.options(CLASSIFY, headers=preflight)
    assert response.status_code == 200
    assert not any(name.startswith("access-control-") for name in response.headers)
    assert options.status_code == 405 and "access-control-allow-origin" not in options.headers


async def test_cors_allows_only_the_configured_origins() -> None:
    allowed, other = "https://app.example", "https://evil.example"
    preflight = {
        "Access-Control-Request-Method": "POST",
        # every request header the API documents: the key, the deadline, v2's binary tensors
        "Access-Control-Request-Headers": "authorization, x-request-timeout, inference-header-content-length",
    }
    async with running_app(cors_allow_origins=[allowed], api_keys=KEYS) as client:
        ok = await client.options(CLASSIFY, headers={"Origin": allowed, **preflight})
        refused = await client.options(CLASSIFY, headers={"Origin": other, **preflight})
        response = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers={"Origin": allowed, **bearer(KEYS[0])})
        unauthorised = await client.post(CLASSIFY, files={"image": DIGIT_7}, headers={"Origin": allowed})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == allowed
    exposed = response.headers["access-control-expose-headers"].lower()
    assert "x-request-id" in exposed and "server-timing" in exposed
    assert unauthorised.status_code == 401 and unauthorised.headers["access-control-allow-origin"] == allowed


def test_cors_origins_are_validated(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("PATCHSERVE_CORS_ALLOW_ORIGINS", "https://app.example/path")
    with pytest.raises(SystemExit):
        load_settings()
    assert "PATCHSERVE_CORS_ALLOW_ORIGINS: Value error, each origin must be" in capsys.readouterr().err
