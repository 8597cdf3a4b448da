"""The content coding a request body was sent with (``Content-Encoding``, RFC 9110, Sec. 8.4).

/v1 and the repository API take bodies as they are; /v2's infer also takes gzip and deflate
(zlib). All three ask :func:`content_coding` whether a body is compressed, so they agree on what
"as it is" means.
"""

from __future__ import annotations

IDENTITY = ("", "identity")  # no header, an empty one, or "identity": the body is as it was sent
SHOWN_CHARACTERS = 40  # of an unsupported coding, quoted back in an error message


def content_coding(header: str | None) -> str | None:
    """The coding named by a ``Content-Encoding`` header value, lowercased, or ``None`` for none.

    Args:
        header: the header's value as received (``None`` when absent).

    Returns:
        ``None`` when the body is not encoded (no header, an empty value or ``identity``), else the
        stripped, lowercased coding, e.g. ``"gzip"``; a list such as ``"gzip, br"`` is returned
        whole, for the caller to refuse.
    """
    coding = (header or "").strip().lower()
    return None if coding in IDENTITY else coding


def shown(coding: str) -> str:
    """``coding`` quoted for an error message, cut to :data:`SHOWN_CHARACTERS` characters."""
    return repr(coding[:SHOWN_CHARACTERS])
