"""The content coding a request body was sent with (``Content-Encoding``, RFC 9110, Sec. 8.4).

/v1 and the repository API take bodies as they are; /v2's infer also takes gzip and deflate
(zlib). All three ask :func:`content_coding` whether a body is compressed, so they agree on what
"as it is" means.
"""

from __future__ import annotations

IDENTITY = ("", "identity")  # no header, an empty one, or "identity": the body is as it was sent
SHOWN_CHARACTERS = 40  # of an unsupported coding, quoted back in an error message


def content_coding(header: str | list[str] | None) -> str | None:
    """The coding named by a ``Content-Encoding`` header value, lowercased, or ``None`` for none.

    Args:
        header: the header's value as received (``None`` when absent), or every value of a request
            that sent the header more than once (``request.headers.getlist``), read as one list
            joined by commas, as RFC 9110, Sec. 5.3 combines them: ``identity`` then ``gzip`` is
            ``"identity, gzip"``, not the first alone. Empty elements are ignored (RFC 9110, Sec.
            5.6.1) and so is ``identity`` (no coding): ``"gzip, "`` and ``"identity, gzip"`` are ``"gzip"``.

    Returns:
        ``None`` when the body is not encoded (no header, an empty value or ``identity``), else the
        stripped, lowercased coding, e.g. ``"gzip"``; a list such as ``"gzip, br"`` is returned
        whole, for the caller to refuse.
    """
    text = ", ".join(header) if isinstance(header, list) else header or ""
    coding = ", ".join(e for e in (e.strip().lower() for e in text.split(",")) if e not in IDENTITY)
    return coding or None


def shown(coding: str) -> str:
    """``coding`` quoted for an error message, cut to :data:`SHOWN_CHARACTERS` characters."""
    return repr(coding[:SHOWN_CHARACTERS])
