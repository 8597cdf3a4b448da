"""``render=png`` and ``Accept: image/png`` beside the rest of the server: when a picture is drawn,
where (its own thread, not the decode pool), within which deadline, and when JSON answers instead."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image

from service.imaging.render import MAX_PICTURE_PIXELS, MIN_FONT_SIZE, bounded_font_size, picture_size
from service.tasks.detection import TASK as DETECTION
from tests.conftest import ROOT, png_bytes, running_app
from tests.service.helpers import assert_problem

pytestmark = pytest.mark.anyio

CANVAS = (ROOT / "examples" / "canvas.png").read_bytes()
DETECT = "/v1/models/detr-digits/detect"
DIGIT = "/v1/models/vit-digits/classify"  # a ViT exported without attention maps


class HeldPicture:
    """The detection task's picture, held until :meth:`release` (a picture that takes long to draw)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.released = threading.Event()
        self.drawn = 0  # pictures that began to be drawn

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldPicture]:
    hold = HeldPicture()
    draw = type(DETECTION).picture

    def picture(self, *args):  # type: ignore[no-untyped-def]
        hold.drawn += 1
        hold.started.set()
        hold.released.wait(60)  # a bound, so a broken test ends; never reached when it passes
        return draw(self, *args)

    monkeypatch.setattr(type(DETECTION), "picture", picture)
    yield hold
    hold.release()


async def test_a_picture_being_drawn_holds_up_no_other_request(held: HeldPicture) -> None:
    # One decode thread: drawn in the decode pool, the held picture would stop every other image.
    async with running_app(decode_threads=1) as client:
        drawing = asyncio.ensure_future(client.post(DETECT + "?render=png", files={"image": CANVAS}))
        assert await asyncio.to_thread(held.started.wait, 60)
        other = await client.post(DETECT, files={"image": CANVAS})
        assert other.status_code == 200 and other.json()["detections"]
        assert not drawing.done()  # still drawing: the other request did not wait for it
        held.release()
        picture = await drawing
    assert picture.status_code == 200 and picture.headers["content-type"] == "image/png"
    assert "render;dur=" in picture.headers["server-timing"]


async def test_a_picture_is_drawn_within_the_requests_deadline(held: HeldPicture) -> None:
    async with running_app() as client:
        late = await client.post(DETECT + "?render=png&timeout=0.5", files={"image": CANVAS})
        assert held.started.is_set()  # it was being drawn (held) when its deadline passed
        held.release()
        after = await client.post(DETECT + "?render=png", files={"image": CANVAS})
    assert_problem(late, 504, "picture")
    assert after.status_code == 200 and after.headers["content-type"] == "image/png"


async def test_a_picture_still_queued_at_its_deadline_is_never_drawn(held: HeldPicture) -> None:
    async with running_app() as client:
        first = asyncio.ensure_future(client.post(DETECT + "?render=png", files={"image": CANVAS}))
        assert await asyncio.to_thread(held.started.wait, 60)  # the one render thread is taken
        queued = await client.post(DETECT + "?render=png&timeout=0.5", files={"image": CANVAS})
        held.release()
        assert (await first).status_code == 200
        last = await client.post(DETECT + "?render=png", files={"image": CANVAS})  # runs after any queued one
    assert_problem(queued, 504, "waited to be drawn")
    assert last.status_code == 200 and held.drawn == 2  # the first and the last: the queued one was dropped


async def test_a_large_image_is_drawn_at_the_bounded_picture_size() -> None:
    big = png_bytes(np.tile(np.arange(3000, dtype=np.uint8), (2000, 1)))  # 3000x2000 = 6 MP, over the bound
    async with running_app() as client:
        detections = await client.post(DETECT + "?threshold=0", files={"image": big})
        picture = await client.post(DETECT + "?render=png", files={"image": big})
    assert detections.json()["image"] == {"width": 3000, "height": 2000}  # the JSON keeps full-size pixels
    drawn = Image.open(io.BytesIO(picture.content))
    assert drawn.size == picture_size((3000, 2000)) and drawn.width * drawn.height <= MAX_PICTURE_PIXELS


@pytest.mark.parametrize(
    ("route", "width", "height"),
    [
        ("/v1/models/vit-cifar10/classify", 60, 70_000),  # the heat map's caption
        # the boxes' labels; 1,000,000 lines: a 4,000,000-line strip is past the decoding budget now (413)
        ("/v1/models/detr-digits/detect?threshold=0", 1, 1_000_000),
        ("/v1/models/detr-digits/detect?threshold=0", 1_000_000, 1),
    ],
)
async def test_a_very_elongated_image_gets_its_picture(route: str, width: int, height: int) -> None:
    # Found by a fresh user: text sized by the longer side alone asked Pillow for a 4,372 px font
    # (a decompression-bomb error) or FreeType for more than it takes (an OSError): a 500.
    strip = png_bytes(np.full((height, width, 3), 90, np.uint8))
    async with running_app() as client:
        picture = await client.post(route, params={"render": "png"}, files={"image": strip})
    assert picture.status_code == 200, picture.text
    drawn = Image.open(io.BytesIO(picture.content))
    assert drawn.size == picture_size((width, height))


def test_text_grows_with_the_picture_but_not_past_a_quarter_of_its_shorter_side() -> None:
    assert bounded_font_size(16, 640, 480) == 16  # an ordinary photo: as the picture asks
    assert bounded_font_size(4372, 59, 69_952) == 14  # 60 x 70,000 drawn at picture_size: 59 x 69,952
    assert bounded_font_size(100_000, 1, 4_000_000) == MIN_FONT_SIZE  # never below the floor
    assert bounded_font_size(3, 300, 200) == MIN_FONT_SIZE


async def test_accept_image_png_gets_json_when_there_is_no_one_picture_to_draw() -> None:
    digit = png_bytes(np.zeros((8, 8), np.uint8))
    png = {"Accept": "image/png"}
    async with running_app() as client:
        no_attention = await client.post(DIGIT, files={"image": digit}, headers=png)
        asked = await client.post(DIGIT + "?render=png", files={"image": digit})
        two = await client.post(DETECT, files=[("image", CANVAS), ("image", CANVAS)], headers=png)
        asked_two = await client.post(DETECT + "?render=png", files=[("image", CANVAS), ("image", CANVAS)])
        tie = await client.post(DETECT, files={"image": CANVAS}, headers={"Accept": "image/png, application/json"})
    assert no_attention.status_code == 200 and no_attention.json()["predictions"]
    assert_problem(asked, 422, "attention")  # asked for by name: say why not
    assert two.status_code == 200 and len(two.json()["results"]) == 2
    assert_problem(asked_two, 400, "one image")
    assert tie.status_code == 200 and tie.headers["content-type"].startswith("application/json")
    for response in (no_attention, two, tie):  # JSON or a PNG by Accept at the same URL: RFC 9110, Sec. 12.5.5
        assert response.headers["vary"] == "Accept"


async def test_a_picture_varies_by_accept_and_embeddings_do_not() -> None:
    async with running_app() as client:
        picture = await client.post(DETECT, files={"image": CANVAS}, headers={"Accept": "image/png"})
        embedding = await client.post(
            "/v1/models/vit-digits/embed", files={"image": png_bytes(np.zeros((8, 8), np.uint8))}
        )
    assert picture.headers["content-type"] == "image/png" and picture.headers["vary"] == "Accept"
    assert embedding.status_code == 200 and "vary" not in embedding.headers
