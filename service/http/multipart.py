"""A multipart/form-data body's image parts, parsed as the body streams in (python-multipart's parser).

Parts named ``image`` are kept (RFC 7578 form data: ``curl -F image=@a.jpg``); parts of other
names are counted against a cap and their data dropped, except a part named as one of the
route's query options (``threshold``, ``top_k``...), which is refused: silently ignored, it
would look applied (as a JSON body's unknown keys are refused, :mod:`service.http.uploads`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from service.core.errors import BadRequest, UnsupportedMediaType

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks  # a TypedDict its stubs define for type checkers only

IMAGE_FIELD = "image"


class _Parts:
    """python-multipart callbacks: keep the data of parts named ``image``, count every part."""

    def __init__(self, *, max_images: int, max_parts: int, options: frozenset[str]) -> None:
        self.max_images, self.max_parts, self.options = max_images, max_parts, options
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
            if (option := self.name.strip().lower().replace("-", "_")) in self.options:  # TOP_K, top-k meant it
                raise BadRequest(
                    f"a form field named {self.name!r}: options go in the query string "
                    f"(?{option}=...), the form holds only '{IMAGE_FIELD}' parts"
                )
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


class MultipartImages:
    """Collects the parts named ``image`` from a multipart body fed in chunks.

    Other parts are counted against ``max_parts`` and their data dropped; a part named in
    ``options`` (the route's query parameters) is a 400. The parser's
    callbacks belong to a separate :class:`_Parts`, so no reference cycle runs through the
    parser: when a request fails, its body is freed at once, not at the next cyclic garbage
    collection (a cycle here kept every refused multipart body, up to the cap, alive).
    """

    def __init__(
        self, boundary: bytes, *, max_images: int, max_parts: int, options: frozenset[str] = frozenset()
    ) -> None:
        self._parts = _Parts(max_images=max_images, max_parts=max_parts, options=options)
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
