"""Reading request bodies: size caps while streaming, multipart limits, empty and malformed bodies."""

from __future__ import annotations

import base64
import socket

import pytest

from tests.conftest import ROOT, running_app
from tests.service.helpers import CHUNK, Chunks, assert_problem

pytestmark = pytest.mark.anyio


DIGIT_7 = (ROOT / "examples" / "digit-7.png").read_bytes()


CLASSIFY = "/v1/models/vit-digits/classify"


@pytest.mark.parametrize("content_type", ["image/png", "application/json", "multipart/form-data; boundary=xyz"])
async def test_a_chunked_body_over_the_limit_is_413_without_reading_the_rest(content_type: str) -> None:
    body = Chunks(1000, prefix=b"--xyz\r\nContent-Disposition: form-data; name=image\r\n\r\n")  # 64 MiB
    async with running_app(max_body_bytes=1024 * 1024) as client:
        response = await client.post(CLASSIFY, content=body, headers={"content-type": content_type})
    assert_problem(response, 413, "over the limit of 1048576 bytes")
    assert "content-length" not in response.request.headers  # it really was sent without one
    # read and dropped up to DRAIN_FACTOR (4) times the cap past it, then answered and closed: not to the end
    assert body.pulled <= 5 * 1024 * 1024 // CHUNK + 2 and body.pulled < 1000
    assert response.headers["connection"] == "close"


async def test_a_body_a_little_over_the_limit_is_read_before_its_413_so_the_client_reads_it() -> None:
    # Found by a fresh user: urllib, which writes the whole body before reading, got a reset for a
    # 21 MB upload (cap 20 MiB): the 413 closed the socket with the body unread. Now it is drained
    # (up to 4x the cap), and the connection stays open.
    for headers in ({}, {"content-length": str(2 * 1024 * 1024)}):  # chunked, and declared
        body = Chunks(2 * 1024 * 1024 // CHUNK)
        async with running_app(max_body_bytes=1024 * 1024) as client:
            response = await client.post(CLASSIFY, content=body, headers={"content-type": "image/png", **headers})
        assert_problem(response, 413, "the limit is 1048576" if headers else "over the limit of 1048576 bytes")
        assert body.pulled == 2 * 1024 * 1024 // CHUNK and "connection" not in response.headers


async def test_a_content_length_over_the_limit_is_413_before_reading() -> None:
    body = Chunks(4)
    async with running_app(max_body_bytes=4096) as client:
        response = await client.post(
            CLASSIFY, content=body, headers={"content-type": "image/png", "content-length": str(200 * 10**6)}
        )
    assert_problem(response, 413, "the body is 200000000 bytes; the limit is 4096")
    assert body.pulled == 0 and response.headers["connection"] == "close"  # over 4x the cap: not read


async def test_a_content_length_that_is_not_a_number_is_400() -> None:
    async with running_app() as client:
        response = await client.post(
            CLASSIFY, content=Chunks(1), headers={"content-type": "image/png", "content-length": "12abc"}
        )
    assert_problem(response, 400, "Content-Length")


async def test_too_many_multipart_parts_or_images_are_400() -> None:
    async with running_app(max_images_per_request=4, max_multipart_parts=6) as client:
        fields = [("note", (None, "x")) for _ in range(7)]
        too_many_parts = await client.post(CLASSIFY, files=[("image", DIGIT_7), *fields])
        too_many_images = await client.post(CLASSIFY, files=[("image", DIGIT_7)] * 5)
        just_enough = await client.post(CLASSIFY, files=[("image", DIGIT_7)] * 4 + [("note", (None, "x"))] * 2)
    assert_problem(too_many_parts, 400, "more than 6 parts")
    assert_problem(too_many_images, 400, "more than 4 images")
    assert just_enough.status_code == 200 and len(just_enough.json()["results"]) == 4


async def test_the_default_part_limit_is_the_setting() -> None:
    async with running_app() as client:
        assert client.app.state.server.settings.max_multipart_parts == 64
        response = await client.post(CLASSIFY, files=[("image", DIGIT_7)] + [("x", (None, "1"))] * 64)
    assert_problem(response, 400, "more than 64 parts")


@pytest.mark.parametrize(
    ("content", "content_type", "detail"),
    [
        (b"", "image/png", "empty"),
        (b"", "application/json", "empty"),
        (b"", "multipart/form-data; boundary=xyz", "empty"),
        (
            b"--xyz\r\nContent-Disposition: form-data; name=image\r\n\r\nabc",
            "multipart/form-data; boundary=xyz",
            "closing boundary",
        ),
        (
            b"--abc\r\nContent-Disposition: form-data; name=image\r\n\r\nabc\r\n--abc--\r\n",
            "multipart/form-data; boundary=xyz",
            "malformed multipart",
        ),
        (b"whatever", "multipart/form-data", "without a boundary"),
        (  # a tester's: the last was used, and the body was "not starting with the boundary"
            b"--XyZ\r\nContent-Disposition: form-data; name=image\r\n\r\nxx\r\n--XyZ--\r\n",
            "multipart/form-data; boundary=XyZ; Boundary=Other",
            "the Content-Type names 2 boundaries; send one",
        ),
        (b'{"images": ["iVBO"], "x": "\xff\xfe"}', "application/json", "not UTF-8 text (at byte 27;"),
        (b"--" + b"B" * 257 + b"\r\n", "multipart/form-data; boundary=" + "B" * 257, "malformed multipart header"),
        (b"[1, 2]", "application/json", '{"images"'),
        (b'{"images": []}', "application/json", '{"images"'),
        (b'{"images": [1]}', "application/json", '{"images"'),
        (b'{"images": ["%%%"]}', "application/json", "images[0] is not valid base64"),
        (b'{"images": ["iVBO"], "threshold": 0.9}', "application/json", "unknown key(s) in the JSON body: 'threshold'"),
        (b"{not json", "application/json", "not valid JSON"),
        # a fresh user's PNG sent as JSON was told "str is not valid UTF-8: surrogates not allowed"
        (b"\x89PNG\r\n\x1a\n" + b"\xff" * 20, "application/json", "the body is a PNG file sent as Content-Type"),
        # counted before parsing: empty arrays cost the parser ten times a number (a stall of seconds)
        (b'{"images": [' + b"[]," * 9 + b'"iVBO"]}', "application/json", "holds 11 arrays and objects, more than 8"),
        # and members: a tester's 2,000,000 keys in one object stalled a worker 5 s
        (
            b'{"images": ["iVBO"]' + b"".join(b',"%x":0' % i for i in range(4096)) + b"}",
            "application/json",
            "holds about 4097 object members (counted by their ':'), more than 4096 allowed",
        ),
        (b'{"images": ["data:image/png;base64iVBO"]}', "application/json", "a data: URL without the comma"),
        (  # a preamble before the first boundary (RFC 2046 allows one; python-multipart does not)
            b"preamble\r\n--abc\r\nContent-Disposition: form-data; name=image\r\n\r\nxx\r\n--abc--\r\n",
            "multipart/form-data; boundary=abc",
            "the body does not start with the Content-Type's boundary",
        ),
        ('{"images": ["iVBO"]}'.encode("utf-16"), "application/json", "JSON must be UTF-8 (RFC 8259, Sec. 8.1)"),
        (  # python-multipart's own words ("Found invalid character 32 in header at 26") said in a client's
            b"--abc\r\nContent-Disposition form-data\r\n\r\nxx\r\n--abc--\r\n",
            "multipart/form-data; boundary=abc",
            "malformed multipart body: a part's header line is not 'Name: value' (at byte 26 of the body)",
        ),
        (
            b"--abc\r\n: no-name\r\n\r\nxx\r\n--abc--\r\n",
            "multipart/form-data; boundary=abc",
            "malformed multipart body: a part's header line has no name (at byte 7 of the body)",
        ),
    ],
)
async def test_malformed_bodies_are_400(content: bytes, content_type: str, detail: str) -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY, content=content, headers={"content-type": content_type})
    assert_problem(response, 400, detail)


async def test_a_boundary_named_inside_a_quoted_parameter_is_not_a_second_one() -> None:
    body = b"--XyZ\r\nContent-Disposition: form-data; name=image\r\n\r\nxx\r\n--XyZ--\r\n"
    async with running_app() as client:
        response = await client.post(
            CLASSIFY, content=body, headers={"content-type": 'multipart/form-data; boundary=XyZ; name="x; boundary=y"'}
        )
    assert_problem(response, 415, "the data is not an image")  # the part was read: its bytes are no image


@pytest.mark.parametrize(
    ("content_type", "detail"),
    [
        ("text/plain", "content type 'text/plain' is not accepted"),
        ("", "the request has no Content-Type; send multipart/form-data"),
        (";;;===", "content type ';;;===' is not accepted"),  # was "(none)": the client did send one
    ],
)
async def test_a_content_type_that_carries_no_image_is_415(content_type: str, detail: str) -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY, content=DIGIT_7, headers={"content-type": content_type})
    assert_problem(response, 415, detail)
    assert response.json()["type"].endswith(":unsupported-media-type")  # not "Not a decodable image"


async def test_an_image_type_that_is_not_an_accepted_format_is_415_naming_it() -> None:
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'
    async with running_app() as client:
        response = await client.post(CLASSIFY, content=svg, headers={"content-type": "image/svg+xml"})
    assert_problem(response, 415, "SVG/XML files are not accepted")


async def test_urls_are_refused_and_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    connections: list[object] = []
    original = socket.socket.connect
    monkeypatch.setattr(
        socket.socket, "connect", lambda self, address: connections.append(address) or original(self, address)
    )
    async with running_app() as client:
        for url in ("http://127.0.0.1:9/digit.png", "https://example.com/a.jpg", "file:///etc/passwd"):
            response = await client.post(CLASSIFY, json={"images": [url]})
            assert_problem(response, 400, "images[0] is a URL; this server fetches nothing")
    assert connections == []


async def test_json_images_may_leave_the_base64_padding_out() -> None:
    # Found by a fresh user: base64 without its '=' padding (RFC 4648, Sec. 3.2) was a 400.
    padded = base64.b64encode(DIGIT_7).decode()
    unpadded = padded.rstrip("=")
    assert unpadded != padded
    async with running_app() as client:
        response = await client.post(CLASSIFY, json={"images": [unpadded, padded]}, params={"top_k": 1})
        impossible = await client.post(CLASSIFY, json={"images": [padded + "A"]})  # 4k+1 characters: no padding fits
    results = response.json()["results"]
    assert response.status_code == 200 and results[0] == results[1]
    assert results[0]["predictions"][0]["label"] == "7"
    assert_problem(impossible, 400, "images[0] is not valid base64")


async def test_json_images_may_be_base64url_but_not_both_alphabets_mixed() -> None:
    # a tester's: URL-safe base64 (RFC 4648, Sec. 5) was "not valid base64"
    standard = base64.b64encode(DIGIT_7).decode()
    urlsafe = base64.urlsafe_b64encode(DIGIT_7).decode().rstrip("=")
    assert ("-" in urlsafe or "_" in urlsafe) and urlsafe != standard.rstrip("=")  # the PNG has both kinds
    mixed = urlsafe.replace("-", "+", 1) if "-" in urlsafe else urlsafe.replace("_", "/", 1)
    async with running_app() as client:
        response = await client.post(CLASSIFY, json={"images": [urlsafe, standard]}, params={"top_k": 1})
        refused = await client.post(CLASSIFY, json={"images": [mixed]})
    results = response.json()["results"]
    assert response.status_code == 200 and results[0] == results[1]
    assert_problem(refused, 400, "images[0] is not valid base64: it mixes the standard alphabet's + / with")


async def test_json_images_answer_in_order_each_with_its_own_status() -> None:
    encoded = base64.b64encode(DIGIT_7).decode()
    images = [encoded, "", base64.b64encode(b"GIF89a").decode(), "data:image/png;base64," + encoded]
    async with running_app() as client:
        response = await client.post(CLASSIFY, json={"images": images}, params={"top_k": 1})
    results = response.json()["results"]
    assert response.status_code == 200
    assert [r.get("status", 200) for r in results] == [200, 400, 415, 200]
    assert results[0] == results[3] and results[0]["predictions"][0]["label"] == "7"
    assert "empty" in results[1]["detail"] and "GIF" in results[2]["detail"]


async def test_multipart_parts_of_other_names_are_dropped_and_images_kept_in_order() -> None:
    blank = (ROOT / "tests" / "images" / "pillow" / "hopper.bmp").read_bytes()
    files = [("meta", (None, "x")), ("image", ("a.png", DIGIT_7)), ("other", ("b", b"zz")), ("image", ("b", blank))]
    async with running_app() as client:
        response = await client.post(CLASSIFY, files=files, params={"top_k": 1})
    results = response.json()["results"]
    assert [r["image"] for r in results] == [{"width": 64, "height": 64}, {"width": 128, "height": 128}]


@pytest.mark.parametrize(
    ("route", "field"),
    [(CLASSIFY, "top_k"), ("/v1/models/detr-digits/detect", "threshold"), (CLASSIFY, "version"), (CLASSIFY, "timeout")],
)
async def test_a_form_field_named_as_the_routes_option_is_400_not_ignored(route: str, field: str) -> None:
    # a tester's `curl -F image=@a.png -F threshold=0.99` got every box above the default 0.5, silently
    files = [("image", ("a.png", DIGIT_7)), (field, (None, "1"))]
    async with running_app() as client:
        response = await client.post(route, files=files)
        not_its_own = "threshold" if route == CLASSIFY else "top_k"  # the other task's option
        other = await client.post(route, files=[*files[:1], (not_its_own, (None, "1"))])
    assert_problem(response, 400, f"a form field named {field!r}: options go in the query string (?{field}=...)")
    assert other.status_code == 200  # a field that is not this route's option is dropped, as any other name


@pytest.mark.parametrize("sent", ["TOP_K", " top_k ", "top-k", "Top-K"])
async def test_a_form_field_named_as_an_option_in_another_case_or_spelling_is_refused_too(sent: str) -> None:
    async with running_app() as client:
        response = await client.post(CLASSIFY, files=[("image", ("a.png", DIGIT_7)), (sent, (None, "1"))])
    assert_problem(response, 400, f"a form field named {sent!r}: options go in the query string (?top_k=...)")


async def test_an_empty_image_part_is_400_for_that_image_only() -> None:
    async with running_app() as client:
        alone = await client.post(CLASSIFY, files={"image": ("empty.png", b"")})
        mixed = await client.post(CLASSIFY, files=[("image", DIGIT_7), ("image", ("empty.png", b""))])
    assert_problem(alone, 400, "empty (0 bytes)")
    assert [r.get("status", 200) for r in mixed.json()["results"]] == [200, 400]


async def test_refused_and_failed_requests_free_their_bodies_without_the_garbage_collector() -> None:
    """A reference cycle through a request's body would keep it alive until the cyclic GC runs
    (rarely: it counts objects, not bytes). One through the multipart parser's callbacks kept
    every refused multipart body; with the GC off, the server must still hold nothing after."""
    import gc
    import tracemalloc

    megabytes = b"\0" * (3 * 1024 * 1024)
    preamble = b"--xyz\r\nContent-Disposition: form-data; name=image\r\n\r\n"
    bad_png = b"\x89PNG\r\n\x1a\n" + megabytes
    client_side = [tracemalloc.Filter(False, "*/httpx/*"), tracemalloc.Filter(False, tracemalloc.__file__)]
    async with running_app(max_body_bytes=4 * 1024 * 1024) as client:
        await client.post(CLASSIFY, files=[("image", DIGIT_7), ("image", b"junk")])  # warm lazy imports
        gc.collect()
        not_base64 = "%" + base64.b64encode(megabytes[: 2**21]).decode()[1:]  # 2.8 MB of base64 but its first character
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot().filter_traces(client_side)
            statuses = [
                (await client.post(CLASSIFY, content=Chunks(100), headers={"content-type": "image/png"})).status_code,
                (
                    await client.post(
                        CLASSIFY,
                        content=Chunks(100, prefix=preamble),
                        headers={"content-type": "multipart/form-data; boundary=xyz"},
                    )
                ).status_code,
                (await client.post(CLASSIFY, files=[("image", megabytes)] + [("x", (None, "1"))] * 70)).status_code,
                (await client.post(CLASSIFY, files=[("image", bad_png), ("image", DIGIT_7)])).status_code,
                (await client.post(CLASSIFY, content=bad_png, headers={"content-type": "image/png"})).status_code,
                (await client.post(CLASSIFY, json={"images": [not_base64]})).status_code,
            ]
            after = tracemalloc.take_snapshot().filter_traces(client_side)
        finally:
            tracemalloc.stop()
            gc.enable()
    assert statuses == [413, 413, 400, 200, 415, 400]
    retained = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert retained < 512 * 1024, f"the server still holds {retained} bytes after the requests"


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate"])
async def test_v1_refuses_a_content_encoding_instead_of_reading_it_as_plain(encoding: str) -> None:
    async with running_app() as client:
        response = await client.post(
            "/v1/models/vit-digits/classify",
            content=DIGIT_7,
            headers={"content-type": "image/png", "content-encoding": encoding},
        )
        plain = await client.post(
            "/v1/models/vit-digits/classify",
            content=DIGIT_7,
            headers={"content-type": "image/png", "content-encoding": "identity"},
        )
    assert_problem(response, 415, f"Content-Encoding {encoding!r} is not accepted on /v1")
    assert plain.status_code == 200


async def test_repeated_content_encoding_or_content_type_headers_are_not_read_first_only() -> None:
    # Found by a tester: "Content-Encoding: identity" then "Content-Encoding: gzip" was read as the
    # first alone (200 for a body declared gzip); a second Content-Type was ignored the same way.
    image = [("content-type", "image/png")]
    async with running_app() as client:
        encoded = await client.post(
            CLASSIFY, content=DIGIT_7, headers=[*image, ("content-encoding", "identity"), ("content-encoding", "gzip")]
        )
        typed = await client.post(CLASSIFY, content=DIGIT_7, headers=[*image, ("content-type", "application/json")])
        listed = await client.post(CLASSIFY, content=DIGIT_7, headers={"content-type": "image/png, application/json"})
        identity = await client.post(
            CLASSIFY, content=DIGIT_7, headers=[*image, ("content-encoding", "identity"), ("content-encoding", "")]
        )
    assert_problem(encoded, 415, "Content-Encoding 'gzip' is not accepted on /v1")  # as one header's list
    assert_problem(typed, 400, "the request has 2 Content-Type headers; send one")
    assert_problem(listed, 400, "names more than one media type")  # one header, read as PNG before
    assert identity.status_code == 200  # "identity, ": an empty list element is ignored (RFC 9110, Sec. 5.6.1)


async def test_json_images_may_be_wrapped_base64_but_other_characters_are_refused() -> None:
    # Found by a fresh user: the base64 command's and base64.encodebytes' 76-character lines were a 400.
    wrapped = base64.encodebytes(DIGIT_7).decode()  # "...\n" every 76 characters, as `base64` writes
    assert "\n" in wrapped.rstrip("\n")
    crlf_unpadded = wrapped.replace("\n", "\r\n").rstrip("\r\n=")  # MIME's CRLF, padding left out
    encoded = base64.b64encode(DIGIT_7).decode()
    spaced = " \t".join(encoded[i : i + 64] for i in range(0, len(encoded), 64))  # spaces and tabs too
    async with running_app() as client:
        images = [wrapped, crlf_unpadded, "data:image/png;base64," + wrapped, spaced]
        response = await client.post(CLASSIFY, json={"images": images}, params={"top_k": 1})
        bad = [
            await client.post(CLASSIFY, json={"images": [wrapped.replace("\n", sep, 1)]}) for sep in ("\v", "\f", "!")
        ]
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["predictions"][0]["label"] for r in results] == ["7"] * 4
    assert results[0] == results[1] == results[2] == results[3]
    for response in bad:  # other whitespace and other characters stay refused
        assert_problem(response, 400, "images[0] is not valid base64")


async def test_a_json_body_of_many_values_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a fresh user: 20 MB of {"images": [...], "x": [0, 0, ...]} was parsed in full on the
    # event loop before its 400 (unknown key): four at once held /healthz up for a second.
    import orjson

    from service.http import uploads

    parsed: list[int] = []
    real = orjson.loads
    monkeypatch.setattr(uploads.orjson, "loads", lambda body: parsed.append(len(body)) or real(body))
    image = base64.b64encode(DIGIT_7).decode()
    body = b'{"images": ["%s"], "x": [' % image.encode() + b"0," * 200_000 + b"0]}"
    async with running_app() as client:
        response = await client.post(CLASSIFY, content=body, headers={"content-type": "application/json"})
        served = await client.post(CLASSIFY, json={"images": [image, "data:image/png;base64," + image]})
    assert_problem(response, 400, "the JSON body holds about 200002 values (counted by their commas); a /v1 body is")
    assert "with at most 32 images" in response.json()["detail"]
    assert parsed == [len(served.request.content)]  # the refused body was never parsed; the good one was
    assert served.status_code == 200 and len(served.json()["results"]) == 2


async def test_a_large_json_body_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from service.core.json_bounds import PARSE_ON_LOOP_BYTES
    from service.http import uploads

    threads: list[str] = []
    real = uploads._json_images

    def recorded(body: bytes, max_images: int) -> list[bytes]:
        threads.append(threading.current_thread().name)
        return real(body, max_images)

    monkeypatch.setattr(uploads, "_json_images", recorded)
    small = {"images": [base64.b64encode(DIGIT_7).decode()]}
    large = {"images": [base64.b64encode(DIGIT_7 + b"\0" * PARSE_ON_LOOP_BYTES).decode()]}  # a PNG with junk after IEND
    async with running_app() as client:
        answers = [await client.post(CLASSIFY, json=body) for body in (small, large)]
    assert [a.status_code for a in answers] == [200, 200], answers[1].text
    assert threads[0] == threading.main_thread().name  # the loop's thread (anyio runs the test's loop there)
    assert threads[1] != threading.main_thread().name and threads[1].startswith("decode"), threads


async def test_an_image_part_with_a_content_transfer_encoding_is_415_saying_why() -> None:
    # A fresh user's base64 part was a 415 "not an image", which did not say why
    encoded = base64.b64encode(DIGIT_7)
    body = (
        b"--xyz\r\nContent-Disposition: form-data; name=image; filename=d.png\r\nContent-Type: image/png\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\n" + encoded + b"\r\n--xyz--\r\n"
    )
    plain = body.replace(b"base64", b"binary").replace(encoded, DIGIT_7)
    async with running_app() as client:
        headers = {"content-type": "multipart/form-data; boundary=xyz"}
        refused = await client.post(CLASSIFY, content=body, headers=headers)
        served = await client.post(CLASSIFY, content=plain, headers=headers)
    assert_problem(refused, 415, "an image part with Content-Transfer-Encoding 'base64' is not decoded")
    assert served.status_code == 200 and served.json()["predictions"][0]["label"] == "7"
