"""Reading the images out of a request body, with the body-size cap applied while reading.

Three request forms carry images (DESIGN.md, "Receive"):

* ``multipart/form-data`` with one or more parts named ``image`` (``curl -F image=@a.jpg``),
  parsed as it streams in: parts with other names are counted and dropped, never kept;
* a raw body with an ``image/*`` or ``application/octet-stream`` content type;
* ``application/json``: ``{"images": ["<base64>", ...]}`` (padding optional; line breaks, spaces and tabs
  inside the base64 are ignored, as MIME's 76-character lines; a ``data:`` URL prefix is allowed; a URL is not fetched).

A ``Content-Length`` over the cap is refused before a byte is read; a chunked body is counted
as it arrives and refused as soon as it passes the cap, so no body over the cap is ever held.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import orjson
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import ClientDisconnect, Request

from service.core.codings import content_coding, shown
from service.core.errors import BadRequest, ClientDisconnected, PayloadTooLarge, UnsupportedMediaType
from service.core.json_bounds import PARSE_ON_LOOP_BYTES, V1_CONTAINERS, check_containers
from service.http.lifetime import BODY_DROPPED, DRAIN_SECONDS, OVERLONG, content_length, drain_body
from service.http.openapi import DIGIT_PNG_BASE64
from service.imaging.formats import sniff_format
from service.pipeline.pool import in_pool

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks  # a TypedDict its stubs define for type checkers only

RAW_TYPES = ("application/octet-stream",)
IMAGE_FIELD = "image"

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
                                "Base64 image files (padding optional; line breaks, spaces and tabs are ignored; "
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


class _Parts:
    """python-multipart callbacks: keep the data of parts named ``image``, count every part."""

    def __init__(self, *, max_images: int, max_parts: int) -> None:
        self.max_images, self.max_parts = max_images, max_parts
        self.images: list[bytes] = []
        self.count = 0
        self.field, self.value = bytearray(), bytearray()
        self.name: str | None = None
        self.transfer = b""  # the part's Content-Transfer-Encoding, lower case
        self.data: list[bytes] = []

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda data, start, end: self.field.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self.value.extend(data[start:end]),
            "on_header_end": self.on_header_end,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self.count += 1
        if self.count > self.max_parts:
            raise BadRequest(f"more than {self.max_parts} parts in one multipart body")
        self.name, self.data, self.transfer = None, [], b""

    def on_header_end(self) -> None:
        if bytes(self.field).lower() == b"content-disposition":
            _, disposition = parse_options_header(bytes(self.value))
            self.name = disposition.get(b"name", b"").decode("latin-1")
        elif bytes(self.field).lower() == b"content-transfer-encoding":
            self.transfer = bytes(self.value).strip().lower()
        self.field.clear()
        self.value.clear()

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.name == IMAGE_FIELD:
            self.data.append(data[start:end])

    def on_part_end(self) -> None:
        if self.name == IMAGE_FIELD:
            if self.transfer not in (b"", b"binary", b"8bit", b"7bit"):  # RFC 7578, Sec. 4.7: senders do not use it
                raise UnsupportedMediaType(
                    f"an image part with Content-Transfer-Encoding {self.transfer[:40].decode('latin-1')!r} is not "
                    "decoded (form data carries a file's bytes as they are, RFC 7578 Sec. 4.7); send it so"
                )
            if len(self.images) >= self.max_images:
                raise BadRequest(f"more than {self.max_images} images in one request")
            self.images.append(b"".join(self.data))
        self.data = []


# python-multipart's messages for a malformed body (python_multipart/multipart.py, 0.0.x), by their
# first words, in a client's terms; the library's own position ("at 26") is within the chunk it
# was fed, so the offset is taken from the error and counted from the start of the body.
_MULTIPART_FAULTS = (
    ("Found invalid character", "a part's header line is not 'Name: value'"),
    ("Found 0-length header", "a part's header line has no name"),
    ("Maximum header size exceeded", "a part's header line is too long"),
    ("Maximum header count exceeded", "a part has too many header lines"),
    ("Did not find LF character at end of header", "a part's header line ends with CR but no LF"),
    ("Did not find LF at end of headers", "the blank line after a part's headers ends with CR but no LF"),
    ("Did not find CR at end of boundary", "a boundary line does not end with CRLF"),
    ("Did not find LF at end of boundary", "a boundary line ends with CR but no LF"),
    ("Did not find CRLF after boundary padding", "a boundary line does not end with CRLF"),
    ("Did not find - at end of boundary", "the closing boundary does not end with '--'"),
    ("Expected boundary character", "the body does not start with the Content-Type's boundary (or has a preamble)"),
)


def _multipart_fault(exc: Exception, received: int) -> str:
    """What is wrong with a multipart body, from python-multipart's error, at which byte of the body."""
    message = str(exc)
    fault = next((words for prefix, words in _MULTIPART_FAULTS if message.startswith(prefix)), None)
    offset = getattr(exc, "offset", None)
    where = f" (at byte {received + offset} of the body)" if isinstance(offset, int) and offset >= 0 else ""
    return (fault or "the multipart parser stopped") + where


class _MultipartImages:
    """Collects the parts named ``image`` from a multipart body fed in chunks.

    Other parts are counted against ``max_parts`` and their data dropped. The parser's
    callbacks belong to a separate :class:`_Parts`, so no reference cycle runs through the
    parser: when a request fails, its body is freed at once, not at the next cyclic garbage
    collection (a cycle here kept every refused multipart body, up to the cap, alive).
    """

    def __init__(self, boundary: bytes, *, max_images: int, max_parts: int) -> None:
        self._parts = _Parts(max_images=max_images, max_parts=max_parts)
        self._received = 0  # bytes written before the current chunk, for the offset of a fault
        try:
            self._parser = MultipartParser(boundary, self._parts.callbacks())
        except Exception as exc:  # e.g. a boundary over python-multipart's 256-character limit
            raise BadRequest(f"malformed multipart header: {exc}") from None

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except (BadRequest, UnsupportedMediaType):
            raise
        except Exception as exc:  # python-multipart raises its own errors for malformed bodies
            raise BadRequest(f"malformed multipart body: {_multipart_fault(exc, self._received)}") from None
        self._received += len(chunk)

    def finish(self) -> list[bytes]:
        if self._parts.count == 0:
            raise BadRequest("the multipart body has no parts (or the boundary does not match the header's)")
        if self._parser.state != MultipartState.END:
            raise BadRequest("the multipart body ends before its closing boundary (truncated upload?)")
        if not self._parts.images:
            raise BadRequest(f"no multipart part named {IMAGE_FIELD!r}; send the file as -F {IMAGE_FIELD}=@file.jpg")
        return self._parts.images


async def _multipart_images(
    request: Request, content_type: str, *, max_body_bytes: int, max_images: int, max_parts: int
) -> list[bytes]:
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    collector = _MultipartImages(boundary, max_images=max_images, max_parts=max_parts)
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


def _json_images(body: bytes, max_images: int) -> list[bytes]:
    check_containers(body, V1_CONTAINERS, 'a JSON body is {"images": ["<base64>", ...]}')
    allowed = 2 * max_images + 16  # an image's separator and its data: URL's comma each, and a few for other keys
    if len(body) > allowed and (commas := body.count(b",")) > allowed:  # 20 MB of numbers: ~0.45 s to parse
        raise BadRequest(
            f"the JSON body holds about {commas + 1} values (counted by their commas); a /v1 body is "
            f'{{"images": ["<base64>", ...]}} with at most {max_images} images'
        )
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if body.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in body[:4]:  # a BOM, or UTF-16/32's zero bytes
            raise BadRequest(
                "the body is not valid JSON: JSON must be UTF-8 (RFC 8259, Sec. 8.1); this looks like UTF-16 or UTF-32"
            ) from None
        if (sniffed := sniff_format(body)) is not None:  # an image file sent with the wrong type
            raise BadRequest(
                f"the body is a {sniffed} file sent as Content-Type application/json: send it with its own type "
                '(e.g. image/png), as multipart (curl -F image=@file), or as JSON {"images": ["<base64>"]}'
            ) from None
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
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
        try:  # padding is optional (RFC 4648, Sec. 3.2: many encoders, e.g. base64url ones, leave it out)
            images.append(base64.b64decode(text + "=" * (-len(text) % 4), validate=True))
        except (binascii.Error, ValueError):
            raise BadRequest(f"images[{i}] is not valid base64") from None
    return images


async def read_images(
    request: Request,
    *,
    max_body_bytes: int,
    max_images: int,
    max_parts: int | None = None,
    pool: Executor | None = None,
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

    Raises:
        BadRequest: empty body, malformed multipart or JSON, no image, too many images or
            parts, a URL instead of a file, more than one Content-Type header or media type (400).
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
