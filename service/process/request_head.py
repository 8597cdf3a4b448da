"""What a request's head must say before it becomes a request: one valid Host, a body coding this server reads.

uvicorn makes a request of any head httptools parses. Two things it lets through are refused here,
from the parsed header fields (:func:`refusal`), before the app sees the request:

* **Host** (RFC 9112, Sec. 3.2): "A server MUST respond with a 400 (Bad Request) status code to
  any HTTP/1.1 request message that lacks a Host header field and to any request message that
  contains more than one Host header field line or a Host header field with an invalid field
  value", as nginx does; uvicorn served all three (a tester's find). A valid value is RFC 3986's
  ``host [ ":" port ]`` (Sec. 3.2.2-3.2.3: a bracketed IP literal, or a name of unreserved,
  percent-encoded and sub-delimiter characters, possibly empty), read loosely as those character
  classes (an IPv6 literal's zone id, ``[fe80::1%25en0]``, which RFC 6874 Sec. 4 asks clients to
  strip, is let through); an HTTP/1.0 request may omit it, but not repeat it.
* **Transfer-Encoding** other than ``chunked`` (RFC 9112, Sec. 6.1): httptools decodes chunked
  alone and reads past the others' bytes as if they were the body, so they are a 501.

An unknown method is refused (501) by the parser before these checks; then Transfer-Encoding is
checked, then Host; a ``CONNECT`` (501) only after both, where httptools stops at its headers' end.
"""

from __future__ import annotations

import re

from service.core.errors import BadRequest, NotImplementedHere, ProblemError

# RFC 3986, Sec. 3.2.2: IP-literal / IPv4address / reg-name, then an optional port.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:._~!$&'()*+,;=%-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?")


def refusal(headers: list[tuple[bytes, bytes]], http_version: str) -> ProblemError | None:
    """Why a request whose head is ``headers`` (lower-case names, as uvicorn keeps them) is refused, or None.

    Args:
        headers: the request's header fields, in order, names in lower case.
        http_version: ``"1.1"`` or ``"1.0"``, as httptools reads the request line.

    Returns:
        :class:`~service.core.errors.NotImplementedHere` (501) for a Transfer-Encoding other
        than chunked; :class:`~service.core.errors.BadRequest` (400) for a missing (HTTP/1.1),
        repeated or invalid Host; None for a head this server reads.
    """
    codings = [c.strip().lower() for n, v in headers if n == b"transfer-encoding" for c in v.split(b",")]
    if any(c not in (b"chunked", b"") for c in codings):
        listed = b", ".join(c for c in codings if c)[:80].decode("latin-1")
        return NotImplementedHere(
            f"Transfer-Encoding {listed!r}: this server decodes chunked alone (RFC 9112, Sec. 6.1); "
            "send the body chunked or with a Content-Length (/v2 infer takes gzip as a Content-Encoding)"
        )
    hosts = [value for name, value in headers if name == b"host"]
    if len(hosts) > 1:
        return BadRequest(f"the request has {len(hosts)} Host headers; send one (RFC 9112, Sec. 3.2)")
    if not hosts:
        if http_version == "1.0":
            return None
        return BadRequest("an HTTP/1.1 request needs a Host header (RFC 9112, Sec. 3.2)")
    if _HOST.fullmatch(hosts[0].strip(b" \t")) is None:
        shown = hosts[0][:80].decode("latin-1")
        return BadRequest(f"the Host header {shown!r} is not a host[:port] (RFC 9112, Sec. 3.2; RFC 3986, Sec. 3.2.2)")
    return None
