"""Reading the images out of a request body, with the body-size cap applied while reading.

Three request forms carry images (DESIGN.md, "Receive"):

* ``multipart/form-data`` with one or more parts named ``image`` (``curl -F image=@a.jpg``),
  parsed as it streams in (:mod:`service.http.multipart`): parts with other names are counted and
  dropped, never kept, but one named as the route's query option is a 400;
* a raw body with an ``image/*`` or ``application/octet-stream`` content type;
* ``application/json``: ``{"images": ["<base64>", ...]}`` (either alphabet, standard or URL-safe;
  padding optional; line breaks, spaces and tabs inside the base64 are ignored, as MIME's
  76-character lines; a ``data:`` URL prefix is allowed; a URL is not fetched).

A ``Content-Length`` over the cap is refused before a byte is read; a chunked body is counted
as it arrives and refused as soon as it passes the cap, so no body over the cap is ever held.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import orjson
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request

from service.core.codings import content_coding, shown
from service.core.errors import BadRequest, ClientDisconnected, PayloadTooLarge, UnsupportedMediaType
from service.core.json_bounds import PARSE_ON_LOOP_BYTES, V1_CONTAINERS, check_containers
from service.http.lifetime import BODY_DROPPED, DRAIN_SECONDS, OVERLONG, content_length, drain_body
from service.http.multipart import IMAGE_FIELD, MultipartImages
from service.http.openapi import DIGIT_PNG_BASE64
from service.imaging.formats import sniff_format
from service.pipeline.pool import in_pool

RAW_TYPES = ("application/octet-stream",)

# The request bodies the inference routes accept, for the OpenAPI document.
OPENAPI_IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [IMAGE_FIELD],
                    "properties": {
                        IMAGE_FIELD: {
                            "description": "One or more image files (repeat the part for several).",
                            "oneOf": [
                                {"type": "string", "format": "binary"},
                                {"type": "array", "items": {"type": "string", "format": "binary"}},
                            ],
                        }
                    },
                }
            },
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["images"],
                    "additionalProperties": False,
                    "properties": {
                        "images": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "contentEncoding": "base64"},
                            "description": (
                                "Base64 image files (standard or URL-safe alphabet; padding optional; line breaks, "
                                "spaces and tabs are ignored; "
                                "a data: URL prefix is allowed; URLs are not fetched)."
                            ),
                        }
                    },
                },
                "example": {"images": [DIGIT_PNG_BASE64]},
            },
        },
    }
}


async def _chunks(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, refusing more than ``max_bytes`` in all.

    Raises:
        PayloadTooLarge: ``Content-Length`` says, or the chunks so far show, the body is over
            ``max_bytes`` (413).
        BadRequest: the client went away mid-body, or the Content-Length is not a number.
    """
    header = request.headers.get("content-length")
    if header is not None:
        declared = content_length(header)
        if declared is None:
            raise BadRequest(f"Content-Length {header[:64]!r} is not a number")
        if declared > max_bytes:
            said = f"{declared}" if declared != OVERLONG else "more than 10**18"
            raise await _too_large(request, f"the body is {said} bytes; the limit is {max_bytes}", max_bytes)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise await _too_large(request, f"the body is over the limit of {max_bytes} bytes", max_bytes)
            if chunk:
                yield chunk
    except ClientDisconnect:
        raise ClientDisconnected("the client disconnected before sending the whole body") from None


DRAIN_FACTOR = 4  # a body over the cap is read and dropped before its 413 when it is at most this many times the cap


async def _too_large(request: Request, detail: str, max_bytes: int) -> PayloadTooLarge:
    """The 413, once the rest of the body is read and dropped (:func:`~service.http.lifetime.drain_body`:
    a client that writes its whole body before reading, as urllib does, gets the 413, not a reset);
    with ``Connection: close`` when it was not (a body over ``DRAIN_FACTOR`` x the cap, or late). The dropped
    bytes are not counted in the worker's body budget: they are never kept."""
    request.scope.setdefault("state", {})[BODY_DROPPED] = True
    drained = await drain_body(request.receive, dict(request.scope["headers"]), DRAIN_FACTOR * max_bytes, DRAIN_SECONDS)
    return PayloadTooLarge(detail, headers={} if drained else {"Connection": "close"})


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refusing more than ``max_bytes`` before it is all read.

    Raises:
        PayloadTooLarge: the body is larger than ``max_bytes`` (413).
        BadRequest: the client went away mid-body, or the Content-Length is not a number.
    """
    return b"".join([chunk async for chunk in _chunks(request, max_bytes)])


def _not_json(body: bytes, refusal: str) -> str:
    """What a /v1 body orjson refused (with ``refusal``) is instead, for its 400."""
    if body.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in body[:4]:  # a BOM, or UTF-16/32's zero bytes
        return "the body is not valid JSON: JSON must be UTF-8 (RFC 8259, Sec. 8.1); this looks like UTF-16 or UTF-32"
    if (sniffed := sniff_format(body)) is not None:  # an image file sent with the wrong type
        return (
            f"the body is a {sniffed} file sent as Content-Type application/json: send it with its own type "
            '(e.g. image/png), as multipart (curl -F image=@file), or as JSON {"images": ["<base64>"]}'
        )
    if "UTF-8" in refusal:  # orjson's words, "str is not valid UTF-8: surrogates not allowed", at char 0
        try:
            body.decode()
        except UnicodeDecodeError as bad:
            first: int | None = bad.start
        else:
            first = None
        if first is not None:
            return (
                f"the body is not valid JSON: it holds bytes that are not UTF-8 text (at byte {first}; "
                "JSON is UTF-8, RFC 8259, Sec. 8.1)"
            )
    return f"the body is not valid JSON: {refusal}"


_BOUNDARY_PARAMETER = re.compile(r";\s*boundary\s*=", re.IGNORECASE)  # a multipart Content-Type's
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')  # a quoted parameter value (RFC 9110, Sec. 5.6.4), which may hold ';'s


async def _multipart_images(
    request: Request,
    content_type: str,
    *,
    max_body_bytes: int,
    max_images: int,
    max_parts: int,
    options: frozenset[str],
) -> list[bytes]:
    if (named := len(_BOUNDARY_PARAMETER.findall(_QUOTED.sub('""', content_type)))) > 1:  # multipart keeps the last
        raise BadRequest(f"the Content-Type names {named} boundaries; send one (RFC 7578, Sec. 4.1)")
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    collector = MultipartImages(boundary, max_images=max_images, max_parts=max_parts, options=options)
    received = False
    async for chunk in _chunks(request, max_body_bytes):
        received = True
        collector.write(chunk)
    if not received:
        raise BadRequest("the request body is empty; send an image")
    return collector.finish()


# ASCII whitespace that encoders put between base64 lines (MIME's CRLF, `base64`'s LF) or that
# a client's wrapping adds; any other character outside the alphabet is still refused.
_BASE64_SPACE = ("\n", "\r", " ", "\t")
_BASE64URL = str.maketrans("-_", "+/")  # the URL- and filename-safe alphabet's two characters, as the standard's


def _json_images(body: bytes, max_images: int) -> list[bytes]:
    check_containers(body, V1_CONTAINERS, 'a JSON body is {"images": ["<base64>", ...]}')
    allowed = 2 * max_images + 16  # an image's separator and its data: URL's comma each, and a few for other keys
    if len(body) > allowed and (commas := body.count(b",")) > allowed:  # 20 MB of numbers: ~0.45 s to parse
        raise BadRequest(
            f"the JSON body holds about {commas + 1} values (counted by their commas); a /v1 body is "
            f'{{"images": ["<base64>", ...]}} with at most {max_images} images'
        )
    refusal: str | None = None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        refusal = str(exc)  # not the error, whose .doc is the body: raised in here, it would hold it
    if refusal is not None:
        raise BadRequest(_not_json(body, refusal))
    encoded = document.get("images") if isinstance(document, dict) else None
    if not isinstance(encoded, list) or not encoded or not all(isinstance(s, str) for s in encoded):
        raise BadRequest('a JSON body must be {"images": ["<base64>", ...]} with at least one image')
    if len(encoded) > max_images:
        raise BadRequest(f"more than {max_images} images in one request")
    if unknown := sorted(set(document) - {"images"}):  # e.g. "threshold": it would be silently ignored
        raise BadRequest(
            f"unknown key(s) in the JSON body: {', '.join(map(repr, unknown))}; the body holds only "
            '"images": options such as threshold or top_k go in the query string (?threshold=0.9)'
        )
    images = []
    for i, text in enumerate(encoded):
        if text.startswith(("http://", "https://", "ftp://", "file:")):
            raise BadRequest(f"images[{i}] is a URL; this server fetches nothing: send the file's bytes in base64")
        if text[:5].lower() == "data:":  # RFC 2397: the scheme is case-insensitive
            head, comma, text = text.partition(",")
            if not comma:
                raise BadRequest(f"images[{i}] is a data: URL without the comma before its data ({head[:40]!r})")
        for space in _BASE64_SPACE:  # wrapped base64: RFC 2045's 76-character lines, `base64`'s output
            if space in text:  # a scan; a copy only when the text has that character
                text = text.replace(space, "")
        text = text.rstrip("=")
        if ("-" in text or "_" in text) and "+" not in text and "/" not in text:  # base64url (RFC 4648, Sec. 5)
            text = text.translate(_BASE64URL)
        try:  # padding is optional (RFC 4648, Sec. 3.2: many encoders, e.g. base64url ones, leave it out)
            images.append(base64.b64decode(text + "=" * (-len(text) % 4), validate=True))
        except (binascii.Error, ValueError):
            mixed = any(c in text for c in "-_") and any(c in text for c in "+/")
            hint = ": it mixes the standard alphabet's + / with the URL-safe one's - _" if mixed else ""
            raise BadRequest(f"images[{i}] is not valid base64{hint}") from None
    return images


async def read_images(
    request: Request,
    *,
    max_body_bytes: int,
    max_images: int,
    max_parts: int | None = None,
    pool: Executor | None = None,
    options: frozenset[str] = frozenset(),
) -> list[bytes]:
    """The image files a request carries, in order.

    Args:
        request: the incoming request; its body is read here.
        max_body_bytes: the body-size cap (413 above it).
        max_images: most images in one request (400 above it).
        max_parts: most multipart parts of any name (400 above it); default ``2 * max_images``.
        pool: where a JSON body over :data:`~service.core.json_bounds.PARSE_ON_LOOP_BYTES` is parsed
            and its base64 decoded (the decode pool), never on the event loop: four 20 MB bodies
            held a worker's ``/healthz`` up for a second (a fresh user's); None: here.
        options: the route's query parameters: a multipart part of one of these names is a 400
            (``-F threshold=0.9`` silently ignored would look applied).

    Raises:
        BadRequest: empty body, malformed multipart or JSON, no image, too many images or
            parts, a form field named as an option, a URL instead of a file, more than one
            Content-Type header or media type (400).
        PayloadTooLarge: body over ``max_body_bytes`` (413).
        UnsupportedMediaType: a content type that is not an image, multipart, JSON or
            octet-stream, or a ``Content-Encoding`` other than identity (415).
    """
    encoding = content_coding(request.headers.getlist("content-encoding"))
    if encoding is not None:
        # Image files are compressed already; a body decoded as if it were not would be a wrong answer.
        raise UnsupportedMediaType(
            f"Content-Encoding {shown(encoding)} is not accepted on /v1: send the image files as they are "
            "(the Open Inference Protocol's /v2 routes take gzip and deflate tensors)"
        )
    if len(types := request.headers.getlist("content-type")) > 1:  # the first alone was read, without a word
        raise BadRequest(f"the request has {len(types)} Content-Type headers; send one")
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if "," in media_type:  # one field, one media type (RFC 9110, Sec. 8.3): image/png, application/json read as PNG
        raise BadRequest(f"Content-Type {content_type[:100]!r} names more than one media type; send one")
    accepted = media_type in ("multipart/form-data", "application/json", *RAW_TYPES) or media_type.startswith("image/")
    if not accepted:
        sent = content_type.strip()
        raise UnsupportedMediaType(
            (
                f"content type {(media_type or sent)[:100]!r} is not accepted"
                if sent
                else "the request has no Content-Type"
            )
            + "; send multipart/form-data with an 'image' part, a raw body with an image/* type, or JSON "
            '{"images": [base64]}'
        )
    if media_type == "multipart/form-data":
        return await _multipart_images(
            request,
            content_type,
            max_body_bytes=max_body_bytes,
            max_images=max_images,
            max_parts=max_parts or 2 * max_images,
            options=options,
        )
    body = await read_body(request, max_body_bytes)
    if not body:
        raise BadRequest("the request body is empty; send an image")
    if media_type == "application/json":
        if pool is None or len(body) <= PARSE_ON_LOOP_BYTES:
            return _json_images(body, max_images)
        future, _ = in_pool(pool, _json_images, body, max_images)  # (cancelled while still queued: never runs)
        images: list[bytes] = await future
        return images
    return [body]
