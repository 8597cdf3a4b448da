"""Domain exceptions: what any layer raises, each carrying its HTTP status and problem type.

Only the exception types live here, with :func:`release_frames` (no web framework, no metrics):
their one mapping to ``application/problem+json`` (RFC 9457) is :mod:`service.http.problems`. A
500 is only ever :class:`InferenceFailed` (a fault of ours) or an unexpected bug; bad input always
maps to a 4xx.
"""

from __future__ import annotations

import traceback
from typing import Any, TypeVar

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "urn:patchserve:problem:"


MAX_DETAIL = 4096  # characters of an error's detail; the rest is cut (it may quote a client's strings)


def shorten_detail(detail: str) -> str:
    """``detail``, cut to :data:`MAX_DETAIL` characters and marked so when longer.

    Details quote what the client sent (an input's name, a datatype, a header): a tester's 5 MB
    input name came back as a 5 MB 400.
    """
    if len(detail) <= MAX_DETAIL:
        return detail
    return f"{detail[:MAX_DETAIL]}… (cut: the detail was {len(detail)} characters)"


E = TypeVar("E", bound=BaseException)


def release_frames(exc: E) -> E:
    """Clear the locals of the frames ``exc`` (and those it was raised from) passed through; drop its traceback.

    Called once an error's answer is made, and on an error kept as an image's outcome. An exception
    that came out of an awaited task or future is in a reference cycle (its traceback holds the
    frame that holds the future, which holds it), which keeps every local of those frames (a
    request's body, its inflated copy, an image's file) until the cycle collector gets there; under
    load such cycles reach the oldest generation, which is collected rarely: a fresh user's 400
    refused 20 MB gzip bodies held 5 GiB. A frame still running (the caller's) cannot be cleared
    (:func:`traceback.clear_frames`), so the traceback goes: log it before. Returns ``exc``.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None  # the catching frame, still running, is in it: it would hold itself
        current = current.__cause__ or current.__context__
    return exc


class RepositoryError(Exception):
    """The model repository cannot be served (layout, manifest, graph); stops start-up."""


class ProblemError(Exception):
    """Base of every error that reaches a client. Subclasses fix ``status`` and ``title``."""

    status: int = 500
    title: str = "Internal error"
    slug: str = "internal"
    outcome: str = "error"  # the patchserve_requests_total outcome label

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        detail = shorten_detail(detail)
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 body: ``type``, ``title``, ``status``, ``detail`` and ``instance``."""
        problem: dict[str, Any] = {
            "type": TYPE_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            problem["instance"] = instance
        return problem


class BadRequest(ProblemError):
    status, title, slug, outcome = 400, "Bad request", "bad-request", "client_error"


class Unauthorized(ProblemError):
    status, title, slug, outcome = 401, "Unauthorized", "unauthorized", "client_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ProblemError):
    status, title, slug, outcome = 403, "Forbidden", "forbidden", "client_error"


class ModelNotFound(ProblemError):
    status, title, slug, outcome = 404, "Model not found", "model-not-found", "client_error"


class BodyTimeout(ProblemError):
    status, title, slug, outcome = 408, "Request body not received in time", "body-timeout", "client_error"


class HeaderTimeout(ProblemError):
    """Answered by the connection protocol (:mod:`service.process.connections`), before any route."""

    status, title, slug, outcome = 408, "Request headers not received in time", "header-timeout", "client_error"


class HeaderFieldsTooLarge(ProblemError):
    """Answered by the connection protocol (:mod:`service.process.connections`), before any route (RFC 6585)."""

    status, title, slug = 431, "Request header fields too large", "request-header-fields-too-large"
    outcome = "client_error"


class NotImplementedHere(ProblemError):
    """A method or a transfer coding this server does not implement (RFC 9110, Sec. 15.6.2), from the connection."""

    status, title, slug, outcome = 501, "Not implemented", "not-implemented", "client_error"


class PayloadTooLarge(ProblemError):
    status, title, slug, outcome = 413, "Payload too large", "payload-too-large", "client_error"


class InvalidImage(ProblemError):
    status, title, slug, outcome = 415, "Not a decodable image", "invalid-image", "client_error"


class UnsupportedMediaType(ProblemError):
    """415 for a body the server cannot read at all (e.g. an unknown ``Content-Encoding``)."""

    status, title, slug, outcome = 415, "Unsupported media type", "unsupported-media-type", "client_error"


class InvalidParameter(ProblemError):
    status, title, slug, outcome = 422, "Invalid parameter", "invalid-parameter", "client_error"


class ClientDisconnected(ProblemError):
    """The client went away before its response was ready (nginx's 499); nobody reads this answer."""

    status, title, slug, outcome = 499, "Client closed request", "client-closed-request", "cancelled"


class InferenceFailed(ProblemError):
    status, title, slug = 500, "Inference failed", "inference-failed"


class ImageProcessingFailed(ProblemError):
    """500 for one image whose decoding or preprocessing raised what no input should make it raise.

    A bug of ours, reported in that image's own ``results`` entry: its batch mates and the rest
    of the request are answered as usual.
    """

    status, title, slug = 500, "Image processing failed", "image-processing-failed"


class Unavailable(ProblemError):
    """503 with ``Retry-After``: queue full, not ready, or draining."""

    status, title, slug, outcome = 503, "Service unavailable", "unavailable", "rejected"

    def __init__(self, detail: str, *, retry_after: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class DeadlineExceeded(ProblemError):
    status, title, slug, outcome = 504, "Deadline exceeded", "deadline-exceeded", "timeout"
