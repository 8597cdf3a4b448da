"""Bounded-time fuzzing (hypothesis) of the two parsers that read untrusted bytes.

decode_image gets valid files of every accepted format mutated (bytes flipped, overwritten,
inserted, cut) and random bytes behind real magic numbers; it must return an image in the mode
asked for and within the pixel limit, or raise one of its 4xx problems: never another
exception, never a hang (pytest-timeout), never a crash. The multipart reader gets the same
treatment. A fixed number of examples keeps it bounded; under CI it is derandomised so a run
is reproducible, and locally each run explores new inputs.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.errors import BadRequest, InvalidImage, PayloadTooLarge
from service.http.multipart import MultipartImages
from service.imaging.images import decode_image
from tests.conftest import ROOT
from tests.service.image_fixtures import GENERATED

MAX_PIXELS = 1 << 20
SEEDS = [case.data for name, build in GENERATED.items() if (case := build()).status == 200 and len(case.data) < 20_000]
SEEDS += [
    (ROOT / "tests" / "images" / "pillow" / name).read_bytes()
    for name in ("hopper.webp", "hopper_gray.jpg", "i_trns.png", "hopper.heif", "pil123p.png")
]
MAGIC = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"GIF89a", b"II*\x00", b"MM\x00*", b"BM", b"\x00\x00\x01\x00"]
MAGIC += [b"RIFF\x00\x00\x00\x00WEBPVP8X", b"\x00\x00\x00\x1cftypavif", b"\x00\x00\x00\x18ftypheic"]
FUZZ = settings(
    max_examples=int(os.environ.get("PATCHSERVE_FUZZ_EXAMPLES", "400")),
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        op = draw(st.sampled_from(["flip", "overwrite", "insert", "cut", "truncate"]))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            patch = draw(st.binary(min_size=1, max_size=16))
            data[at : at + len(patch)] = patch
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at:]
    return bytes(data)


files = st.one_of(
    mutated(),
    st.builds(lambda magic, rest: magic + rest, st.sampled_from(MAGIC), st.binary(max_size=512)),
    st.binary(max_size=256),
)


@pytest.mark.timeout(600)
@FUZZ
@given(data=files, color_mode=st.sampled_from(["L", "RGB"]), draft=st.booleans())
def test_decode_image_answers_every_input_with_an_image_or_a_4xx(data: bytes, color_mode: str, draft: bool) -> None:
    try:
        decoded = decode_image(data, color_mode=color_mode, max_pixels=MAX_PIXELS, draft_size=(8, 8) if draft else None)
    except (BadRequest, InvalidImage, PayloadTooLarge) as exc:
        assert exc.status in (400, 413, 415) and exc.detail
        return
    assert decoded.image.mode == color_mode
    assert 1 <= decoded.width * decoded.height <= MAX_PIXELS
    assert decoded.image.size[0] >= 1 and decoded.image.size[1] >= 1


@st.composite
def multipart_bodies(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from([b"image", b"other", b"", b'"image"']))
        parts.append(
            b"--b0und\r\nContent-Disposition: form-data; name=" + name + b"\r\n\r\n" + draw(st.binary(max_size=64))
        )
    body = bytearray(b"\r\n".join(parts) + b"\r\n--b0und--\r\n")
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(body)))
        body[at : at + draw(st.integers(0, 8))] = draw(st.binary(max_size=8))
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    return bytes(body), cuts


@pytest.mark.timeout(300)
@FUZZ
@given(case=multipart_bodies())
def test_the_multipart_reader_answers_every_body_with_images_or_a_400(case: tuple[bytes, list[int]]) -> None:
    body, cuts = case
    reader = MultipartImages(b"b0und", max_images=3, max_parts=5)
    try:
        for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):  # fed in arbitrary chunks
            reader.write(body[start:end])
        images = reader.finish()
    except BadRequest as exc:
        assert exc.status == 400 and exc.detail
        return
    assert 1 <= len(images) <= 3 and all(isinstance(image, bytes) for image in images)
