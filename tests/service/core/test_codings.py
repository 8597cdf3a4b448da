"""``content_coding``: what /v1, /v2 and the repository API take as a body sent as it is."""

from __future__ import annotations

import pytest

from service.core.codings import SHOWN_CHARACTERS, content_coding, shown


@pytest.mark.parametrize("header", [None, "", "  ", "identity", "IDENTITY", " Identity "])
def test_no_coding_is_none(header: str | None) -> None:
    assert content_coding(header) is None


@pytest.mark.parametrize(
    ("header", "coding"), [("gzip", "gzip"), (" GZip ", "gzip"), ("Deflate", "deflate"), ("gzip, br", "gzip, br")]
)
def test_a_coding_is_lowercased_and_stripped(header: str, coding: str) -> None:
    assert content_coding(header) == coding


def test_a_long_coding_is_cut_when_shown() -> None:
    coding = content_coding("x" * 10_000)
    assert coding is not None
    assert shown(coding) == repr("x" * SHOWN_CHARACTERS)


def test_a_header_sent_twice_is_one_list() -> None:
    """RFC 9110, Sec. 5.3: field lines of one name combine into one comma-separated list."""
    assert content_coding([]) is None and content_coding(["identity"]) is None
    assert content_coding(["identity", "gzip"]) == "gzip"  # not read as the first alone; identity is no coding
    assert content_coding(["identity", "identity"]) is None and content_coding("identity, br, gzip") == "br, gzip"
    assert content_coding(["GZIP"]) == "gzip"
    assert content_coding(["identity", ""]) is None and content_coding("gzip, ,") == "gzip"  # empty elements ignored
