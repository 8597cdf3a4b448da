"""Reading the images out of a request body, with the body-size cap applied while reading.

Three request forms carry images (DESIGN.md, "Receive"):

* ``multipart/form-data`` with one or more parts named ``image`` (``curl -F image=@a.jpg``);
* a raw body with an ``image/*`` or ``application/octet-stream`` content type;
* ``application/json``: ``{"images": ["<base64>", ...]}`` (a ``data:`` URL prefix is allowed).
"""

from __future__ import annotations

import base64
import binascii

import orjson
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from service.errors import BadRequest, InvalidImage, PayloadTooLarge

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
                    "properties": {
                        "images": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "contentEncoding": "base64"},
                            "description": "Base64-encoded image files.",
                        }
                    },
                }
            },
        },
    }
}


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refusing more than ``max_bytes`` before it is all read.

    A ``Content-Length`` above the cap is refused before a byte is read; a chunked body is
    counted as it arrives and refused as soon as it passes the cap.

    Raises:
        PayloadTooLarge: the body is larger than ``max_bytes`` (413).
        BadRequest: the client went away mid-body, or the Content-Length is not a number.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(f"Content-Length {declared!r} is not a number")
        if int(declared) > max_bytes:
            raise PayloadTooLarge(f"the body is {declared} bytes; the limit is {max_bytes}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"the body is over the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest("the client disconnected before sending the whole body") from None
    return b"".join(chunks)


def _multipart_images(body: bytes, content_type: str, max_images: int) -> list[bytes]:
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise BadRequest("multipart/form-data without a boundary")
    images: list[bytes] = []
    state: dict[str, object] = {"header": b"", "name": None, "data": []}

    def on_part_begin() -> None:
        state["name"], state["data"] = None, []

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["header"] = data[start:end].lower()

    def on_header_value(data: bytes, start: int, end: int) -> None:
        if state["header"] == b"content-disposition":
            _, disposition = parse_options_header(data[start:end])
            state["name"] = disposition.get(b"name", b"").decode("latin-1")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        state["data"].append(data[start:end])  # type: ignore[union-attr]

    def on_part_end() -> None:
        if state["name"] == IMAGE_FIELD:
            if len(images) >= max_images:
                raise BadRequest(f"more than {max_images} images in one request")
            images.append(b"".join(state["data"]))  # type: ignore[arg-type]

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except BadRequest:
        raise
    except Exception as exc:  # python-multipart raises its own errors for malformed bodies
        raise BadRequest(f"malformed multipart body: {exc}") from None
    if not images:
        raise BadRequest(f"no multipart part named {IMAGE_FIELD!r}; send the file as -F {IMAGE_FIELD}=@file.jpg")
    return images


def _json_images(body: bytes, max_images: int) -> list[bytes]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    encoded = document.get("images") if isinstance(document, dict) else None
    if not isinstance(encoded, list) or not encoded or not all(isinstance(s, str) for s in encoded):
        raise BadRequest('a JSON body must be {"images": ["<base64>", ...]} with at least one image')
    if len(encoded) > max_images:
        raise BadRequest(f"more than {max_images} images in one request")
    images = []
    for i, text in enumerate(encoded):
        if text.startswith("data:"):
            text = text.partition(",")[2]
        try:
            images.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            raise BadRequest(f"images[{i}] is not valid base64") from None
    return images


async def read_images(request: Request, *, max_body_bytes: int, max_images: int) -> list[bytes]:
    """The image files a request carries, in order.

    Raises:
        BadRequest: empty body, malformed multipart or JSON, no image, too many images (400).
        PayloadTooLarge: body over ``max_body_bytes`` (413).
        InvalidImage: a content type that is not an image, multipart, JSON or octet-stream (415).
    """
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    accepted = media_type in ("multipart/form-data", "application/json", *RAW_TYPES) or media_type.startswith("image/")
    if not accepted:
        raise InvalidImage(
            f"content type {media_type or '(none)'!r} is not accepted; send multipart/form-data with an "
            f"'image' part, a raw body with an image/* type, or JSON {{\"images\": [base64]}}"
        )
    body = await read_body(request, max_body_bytes)
    if not body:
        raise BadRequest("the request body is empty; send an image")
    if media_type == "multipart/form-data":
        return _multipart_images(body, content_type, max_images)
    if media_type == "application/json":
        return _json_images(body, max_images)
    return [body]
