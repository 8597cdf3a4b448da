"""API keys and CORS: who may call the server, as ASGI middleware the app factory installs.

API keys are bearer tokens (RFC 6750, section 2.1: ``Authorization: Bearer <key>``), set with
``PATCHSERVE_API_KEYS``; without keys the server is open, as Triton and TorchServe are by
default. A missing or wrong key is a 401 (a problem; on /v2 the protocol's ``{"error": ...}``, which
tritonclient reads) with ``WWW-Authenticate: Bearer``, answered
before the route runs and before the body is read. Keys are compared in constant time: each
side is hashed with SHA-256 and the digests compared with :func:`hmac.compare_digest` against
every configured key, so neither a key's content nor its length shows in the timing.

Paths in ``PATCHSERVE_AUTH_PUBLIC_PATHS`` (default ``/healthz``, ``/readyz``, ``/metrics``,
``/v2/health/live``, ``/v2/health/ready``) need no key: orchestrator probes and Prometheus
scrapes usually carry none. Exempting paths on one port was chosen over a second listening port
because it keeps one socket per server with any number of uvicorn workers and one address for
the container to expose; an operator who wants ``/metrics`` behind the key removes it from the
list (Prometheus sends a bearer token with ``authorization: {credentials: ...}``).

CORS is off unless ``PATCHSERVE_CORS_ALLOW_ORIGINS`` names origins: then Starlette's
``CORSMiddleware`` answers preflights and lets those origins read responses, including the
``X-Request-ID``, ``Server-Timing`` and ``Retry-After`` headers.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.errors import BadRequest, Unauthorized
from service.core.settings import Settings
from service.http.problems import error_response_for


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def check_bearer(authorization: bytes | None, key_digests: Iterable[bytes]) -> Unauthorized | None:
    """The problem with an ``Authorization`` header value, or None when it carries a known key.

    Args:
        authorization: the raw header value (None when absent).
        key_digests: SHA-256 digests of the accepted keys.
    """
    if not authorization:
        return Unauthorized("this server needs an API key: send the header Authorization: Bearer <key>")
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return Unauthorized("the Authorization header must be Bearer <key>")
    digest = _digest(token)
    matched = False
    for known in key_digests:  # no early exit: the time spent does not depend on which key matched
        matched |= hmac.compare_digest(digest, known)
    return None if matched else Unauthorized("the API key is not valid")


class ApiKeyMiddleware:
    """Refuses HTTP requests without a valid bearer key, except on ``public_paths``.

    Args:
        app: the ASGI app to protect.
        keys: the accepted keys (non-empty).
        public_paths: exact paths served without a key.
    """

    def __init__(self, app: ASGIApp, *, keys: Iterable[str], public_paths: Iterable[str]) -> None:
        self.app = app
        self.key_digests = [_digest(key.encode("utf-8")) for key in keys]
        if not self.key_digests:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.public_paths = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        given = [value for name, value in scope["headers"] if name == b"authorization"]
        problem: BadRequest | Unauthorized | None
        if len(given) > 1:  # a singleton field (RFC 9110, Sec. 5.3): which one counts would be a guess
            problem = BadRequest(f"the request has {len(given)} Authorization headers; send one: Bearer <key>")
        else:
            problem = check_bearer(given[0] if given else None, self.key_digests)
        if problem is None:
            await self.app(scope, receive, send)
            return
        response = error_response_for(scope["path"], problem, scope.get("state", {}).get("request_id"))
        await response(scope, receive, send)


def add_security_middleware(
    app: FastAPI, settings: Settings, public_paths: Iterable[str] = ()
) -> frozenset[str] | None:
    """Install API-key checking (when keys are set) and CORS (when origins are set) on ``app``.

    ``public_paths`` are served without a key besides ``settings.auth_public_paths`` (the
    playground's static files, which a browser fetches without a Bearer header).

    Call it before adding the request-id middleware, which must stay outermost so that a 401
    carries the request id. CORS wraps the key check, so preflights (which carry no key) are
    answered and a 401 still carries the CORS headers a browser needs to read it.

    Returns:
        The paths served without a key when keys are set (for the OpenAPI document's
        :func:`service.http.openapi.declare_bearer`), else None.
    """
    public = None
    if settings.api_keys:
        public = frozenset([*settings.auth_public_paths, *public_paths])
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys, public_paths=public)
    if settings.cors_allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Content-Encoding",  # v2: gzip or deflate request bodies
                "X-Request-ID",
                "X-Request-Timeout",
                "Inference-Header-Content-Length",  # v2 binary tensors
            ],
            expose_headers=["X-Request-ID", "Server-Timing", "Retry-After", "Inference-Header-Content-Length"],
            max_age=600,
        )
    return public
