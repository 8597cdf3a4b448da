"""The decoded-pixel budgets of a worker and of a request, and dropping pictures once used (issue 15 F)."""

from __future__ import annotations

import asyncio
import io
import threading

import numpy as np
import pytest
from PIL import Image

from service.core.errors import DeadlineExceeded, PayloadTooLarge
from service.imaging.pixel_budget import PixelBudget
from service.pipeline import decoding, inference
from tests.conftest import running_app
from tests.service.batching.fakes import ManualClock

pytestmark = pytest.mark.anyio
CLASSIFY = "/v1/models/vit-digits/classify"


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 200).save(buffer, "PNG")
    return buffer.getvalue()


async def test_the_budget_grants_in_arrival_order_and_refuses_what_never_fits() -> None:
    budget = PixelBudget(100)
    order: list[str] = []

    async def hold(name: str, pixels: int, release: asyncio.Event) -> None:
        async with budget.reserve(pixels, timeout=None):
            order.append(name)
            await release.wait()

    big_done, small_done, later_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(hold("first", 70, big_done))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("second", 60, small_done))  # does not fit beside the first: waits
    third = asyncio.create_task(hold("third", 10, later_done))  # would fit, but never overtakes the second
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["first"] and budget.held == 70 and budget.waiting == 2
    big_done.set()
    await first
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["first", "second", "third"] and budget.held == 70
    small_done.set()
    later_done.set()
    await asyncio.gather(second, third)
    assert budget.held == 0 and budget.waiting == 0
    with pytest.raises(PayloadTooLarge, match="PATCHSERVE_MAX_DECODING_PIXELS"):
        async with budget.reserve(101, timeout=None):
            pass


async def test_an_image_waits_for_room_until_its_deadline_then_gets_a_504() -> None:
    budget = PixelBudget(100)
    async with budget.reserve(100, timeout=None):
        with pytest.raises(DeadlineExceeded, match="decoding room"):
            async with budget.reserve(1, timeout=0.01):
                pass
        assert budget.waiting == 0  # the one that gave up left the queue
    assert budget.held == 0
    async with budget.reserve(100, timeout=0.01):  # and the budget is whole again
        assert budget.held == 100


async def test_a_request_past_its_pixel_total_gets_413_entries_for_the_images_that_do_not_fit() -> None:
    # 64x64 = 4,096 pixels and 128 lines = 8,192 pixels' worth each: the first two fit in 20,000, the
    # third would not, a 32x32 (1,024 + 32 x 64 = 3,072) still does.
    files = [("image", png(64, 64)), ("image", png(64, 64)), ("image", png(64, 64)), ("image", png(32, 32))]
    async with running_app(max_request_pixels=20_000) as client:
        response = await client.post(CLASSIFY, files=files)
    results = response.json()["results"]
    assert [r.get("status", 200) for r in results] == [200, 200, 413, 200]
    assert "PATCHSERVE_MAX_REQUEST_PIXELS" in results[2]["detail"] and "8192 pixels' worth" in results[2]["detail"]
    assert "send fewer or smaller images" in results[2]["detail"]
    async with running_app(max_request_pixels=8_000) as client:  # one image past the total alone
        alone = (await client.post(CLASSIFY, files={"image": png(64, 64)})).json()["detail"]
    # a fresh user's lone 39,999,999x1 strip was told to send fewer images per request
    assert "even alone; send a smaller image" in alone and "fewer" not in alone


async def test_a_strip_image_counts_its_lines_and_a_tall_one_is_refused_from_its_header() -> None:
    # Found by a fresh user: a 77 KB PNG of 1x40,000,000 pixels held +610 MiB and 3 s of CPU, as much as
    # 16 photos of its pixel count; Pillow spends ~17-25 bytes on every line. 2,000,000 pixels in one
    # column count 2,000,000 + 32 x 2,000,001 = 66,000,032 pixels' worth: past a budget of 48,000,000.
    from service.imaging.images import LINE_PIXELS, open_image

    strip, square = png(1, 2_000_000), png(1000, 2000)
    opened = open_image(strip, color_mode="L", max_pixels=40_000_000)
    assert opened.pixels == 2_000_000 and opened.cost == 2_000_000 + LINE_PIXELS * 2_000_001
    async with running_app(max_decoding_pixels=48_000_000) as client:
        refused = await client.post(CLASSIFY, files={"image": strip})
        served = await client.post(CLASSIFY, files={"image": square})  # the same pixels, 3,000 lines
        held_after = client.app.state.server.pixel_budget.held
    assert refused.status_code == 413 and "PATCHSERVE_MAX_DECODING_PIXELS" in refused.json()["detail"]
    assert "a row or column" in refused.json()["detail"]
    assert served.status_code == 200 and held_after == 0


async def test_an_image_larger_than_the_worker_budget_alone_is_a_413_entry() -> None:
    async with running_app(max_decoding_pixels=5_000) as client:
        response = await client.post(CLASSIFY, files=[("image", png(100, 100)), ("image", png(40, 40))])  # 4,160 fits
    big, small = response.json()["results"]
    assert big["status"] == 413 and "PATCHSERVE_MAX_DECODING_PIXELS" in big["detail"]
    assert small["predictions"]


async def test_images_decoding_at_once_never_hold_more_than_the_worker_budget(concurrent_decodes) -> None:
    # 8,192 pixels' worth each (64x64, 128 lines), a budget of 20,000: two at once, though each request
    # may decode two and the pool has four threads; two requests of three images each.
    async with running_app(decode_threads=4, max_decoding_pixels=20_000) as client:
        responses = await asyncio.gather(*(client.post(CLASSIFY, files=[("image", png(64, 64))] * 3) for _ in range(2)))
        held_after = client.app.state.server.pixel_budget.held
    assert [len(r.json()["results"]) for r in responses] == [3, 3]
    assert all("predictions" in r for response in responses for r in response.json()["results"])
    assert concurrent_decodes.peak <= 2 and held_after == 0


async def test_the_full_size_picture_is_dropped_unless_render_needs_it() -> None:
    async with running_app() as client:
        model = client.app.state.server.repository.get("vit-digits")
        pool = client.app.state.server.decode_pool
        kept, dropped = [
            await inference.infer_images(model, [png(640, 480)], pool=pool, max_pixels=10**6, keep_images=keep)
            for keep in (True, False)
        ]
    assert kept[0].image.image is not None and kept[0].image.image.size == (640, 480)
    assert dropped[0].image.image is None and dropped[0].image.size == (640, 480)
    assert dropped[0].image.width == 640 and dropped[0].result is not None


def test_a_large_still_webp_is_decoded_scaled_like_a_jpeg_draft() -> None:
    # Issue 15 F: Pillow's WebP path held three full canvases (608 MiB for a 6300x6300 file).
    from service.imaging.images import decode_image

    buffer = io.BytesIO()
    Image.new("RGB", (4000, 3000), (30, 60, 90)).save(buffer, "WEBP", lossless=True)
    decoded = decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**8, draft_size=(128, 128))
    assert (decoded.width, decoded.height) == (4000, 3000)  # the size as displayed, in full
    assert decoded.size == (342, 256)  # twice the target on the short side, ceil(4000 * 256 / 3000) on the long
    assert decoded.image.getpixel((5, 5)) == (30, 60, 90)
    whole = decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**8)  # no draft size: full size
    assert whole.size == (4000, 3000)


async def test_the_request_answers_504_at_its_deadline_while_a_decode_runs_on(monkeypatch) -> None:
    # Issue 15 B: ?timeout=1 was answered only when the decode ended (9.8 s). A decode thread
    # cannot be interrupted: the request answers at its deadline, and the image's pixels stay
    # reserved until the thread really ends.
    release, started = threading.Event(), threading.Event()
    original = decoding._decode_and_preprocess

    def stuck(*args):
        started.set()
        release.wait(60)  # a decode that runs on past the deadline
        return original(*args)

    monkeypatch.setattr(decoding, "_decode_and_preprocess", stuck)
    async with running_app() as client:
        budget = client.app.state.server.pixel_budget
        # The batcher's clock stands still, so the request's deadline can only pass in the decode's
        # wait (0.2 s of real time), never while its body is read on a busy machine.
        monkeypatch.setattr(client.app.state.server.repository.get("vit-digits").batcher, "clock", ManualClock())
        # 3 s of real time: the decode thread starts well before the deadline (a decode still queued at
        # its deadline is dropped, never run: tests/service/pipeline/test_pool.py).
        posted = asyncio.ensure_future(client.post(CLASSIFY, files={"image": png(64, 64)}, params={"timeout": 3}))
        for _ in range(6000):  # a bound on waiting for the thread to start, never a measured figure
            if started.is_set():
                break
            await asyncio.sleep(0.01)
        response = await posted
        held_while_running = budget.held
        release.set()
        for _ in range(6000):  # a bound on waiting for the thread, never a measured figure
            if budget.held == 0:
                break
            await asyncio.sleep(0.01)
        held_after = budget.held
    assert started.is_set() and response.status_code == 504, response.text
    assert "deadline passed while this image was being decoded" in response.json()["detail"]
    assert held_while_running == 64 * 64 + 32 * 128 and held_after == 0  # its pixels and lines


async def test_try_acquire_never_waits_and_never_overtakes_a_waiter() -> None:
    budget = PixelBudget(100)
    assert budget.try_acquire(60) and budget.held == 60
    assert not budget.try_acquire(41) and budget.held == 60  # does not fit
    waiter = asyncio.create_task(budget.acquire(50, timeout=None))
    await asyncio.sleep(0)
    assert budget.waiting == 1
    assert not budget.try_acquire(10)  # would fit, but someone waits
    budget.release(60)
    await waiter
    assert budget.held == 50 and budget.waiting == 0
    assert not budget.try_acquire(101)  # more than the whole budget: the loop's acquire says 413
    # From several threads at once, the budget is never overdrawn.
    budget.release(50)
    granted: list[bool] = []
    threads = [
        threading.Thread(target=lambda: granted.extend(budget.try_acquire(30) for _ in range(50))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted.count(True) == 3 and budget.held == 90


async def test_a_lone_image_goes_to_the_decode_pool_once_several_go_twice_each(monkeypatch) -> None:
    # Issue 14 item 4: header, budget and decode in one trip for a request's only image.
    trips: list[str] = []
    async with running_app() as client:
        pool = client.app.state.server.decode_pool
        submit = pool.submit

        def counted(fn, *args, **kwargs):
            trips.append(fn.__name__)
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(pool, "submit", counted)
        one = await client.post(CLASSIFY, files={"image": png(64, 64)})
        lone = list(trips)
        trips.clear()
        two = await client.post(CLASSIFY, files=[("image", png(64, 64)), ("image", png(32, 32))])
        held_after = client.app.state.server.pixel_budget.held
    assert one.status_code == 200 and one.json()["predictions"]
    assert lone == ["_open_and_decode"]
    assert sorted(trips) == ["_decode_and_preprocess"] * 2 + ["_probe"] * 2
    assert [r["predictions"] != [] for r in two.json()["results"]] == [True, True] and held_after == 0


async def test_a_lone_image_without_room_waits_on_the_loop_and_is_decoded_when_room_comes() -> None:
    async with running_app(max_decoding_pixels=10_000) as client:
        budget = client.app.state.server.pixel_budget
        budget.try_acquire(10_000)  # the whole budget held by "another image"
        request = asyncio.create_task(client.post(CLASSIFY, files={"image": png(64, 64)}))
        for _ in range(6000):  # a bound on waiting for the request to queue for room, never a measured figure
            if budget.waiting:
                break
            await asyncio.sleep(0.01)
        waited = budget.waiting
        budget.release(10_000)
        response = await request
        held_after = budget.held
    assert waited == 1 and response.status_code == 200 and response.json()["predictions"]
    assert held_after == 0


async def test_a_lone_image_past_the_request_pixel_total_is_a_413() -> None:
    async with running_app(max_request_pixels=1_000) as client:
        response = await client.post(CLASSIFY, files={"image": png(64, 64)})
        held_after = client.app.state.server.pixel_budget.held
    assert response.status_code == 413 and "PATCHSERVE_MAX_REQUEST_PIXELS" in response.json()["detail"]
    assert held_after == 0


def test_an_animated_webps_first_frame_is_decoded_as_a_scaled_still() -> None:
    # Pillow decodes an animation through three full canvases (+609 MiB for two 6300x6300 frames);
    # a first frame that covers the canvas is the same pixels as a still of its own bitstream.
    from service.imaging.images import decode_image
    from service.imaging.webp_scaled import first_frame

    rng = np.random.default_rng(0)
    for mode in ("RGB", "RGBA"):
        for lossless in (False, True):
            frames = [Image.fromarray(rng.integers(0, 255, (60, 80, len(mode)), np.uint8), mode) for _ in range(3)]
            buffer = io.BytesIO()
            frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:], lossless=lossless)
            frame = first_frame(buffer.getvalue())
            assert frame is not None and frame.box == (0, 0, 80, 60)
            animated = Image.open(io.BytesIO(buffer.getvalue())).convert("RGBA")  # Pillow's frame 0
            alone = Image.open(io.BytesIO(frame.still))
            assert alone.n_frames == 1 and alone.size == (80, 60)
            np.testing.assert_array_equal(np.asarray(alone.convert("RGBA")), np.asarray(animated))
    # Decoded with a draft size, a large animation's first frame is scaled as a still is.
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (4000, 3000), colour) for colour in ((30, 60, 90), (90, 60, 30))]
    frames[0].save(buffer, "WEBP", lossless=True, save_all=True, append_images=frames[1:])
    decoded = decode_image(buffer.getvalue(), color_mode="RGB", max_pixels=10**8, draft_size=(128, 128))
    assert (decoded.width, decoded.height) == (4000, 3000) and decoded.size == (342, 256)
    assert decoded.image.getpixel((5, 5)) == (30, 60, 90)  # the first frame, not the second
    # A frame past the canvas's edge is left to Pillow (libwebp's demuxer refuses it), as is a still.
    data = bytearray(buffer.getvalue())
    anmf = data.index(b"ANMF") + 8
    data[anmf : anmf + 3] = b"\x01\x00\x00"  # x offset 2: the 4000-wide frame passes the edge
    assert first_frame(bytes(data)) is None and first_frame(b"RIFF\0\0\0\0WEBPVP8 ") is None


def test_an_animated_webps_small_first_frame_is_drawn_scaled_on_its_canvas() -> None:
    # A fresh user's 140-byte file, a 2x2 first frame on a 6324x6324 canvas, took +699 MiB and 1 s
    # through Pillow's three canvases. The frame is decoded alone, scaled, and placed as libwebp
    # draws it: on a transparent canvas (white once composited) or, without alpha, a black one.
    import struct

    from service.imaging.images import decode_image

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return tag + struct.pack("<I", len(payload)) + payload + b"\0" * (len(payload) & 1)

    def u24(value: int) -> bytes:
        return value.to_bytes(3, "little")

    still = io.BytesIO()
    Image.new("RGBA", (400, 300), (255, 0, 0, 255)).save(still, "WEBP", lossless=True)
    bitstream = still.getvalue()[12:]
    for alpha, around in ((True, (255, 255, 255)), (False, (0, 0, 0))):
        body = chunk(b"VP8X", bytes([0x02 | (0x10 if alpha else 0)]) + bytes(3) + u24(1999) + u24(1499))
        body += chunk(b"ANIM", bytes(6))
        for x, y in ((800, 600), (0, 0)):
            body += chunk(b"ANMF", u24(x // 2) + u24(y // 2) + u24(399) + u24(299) + u24(100) + b"\0" + bitstream)
        data = b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body
        scaled = decode_image(data, color_mode="RGB", max_pixels=10**8, draft_size=(128, 128))
        whole = decode_image(data, color_mode="RGB", max_pixels=10**8)  # Pillow's frame 0, full size
        assert scaled.size == (342, 256) and whole.size == (2000, 1500)
        assert scaled.image.getpixel((5, 5)) == whole.image.getpixel((5, 5)) == around
        assert scaled.image.getpixel((171, 128)) == whole.image.getpixel((1000, 750)) == (255, 0, 0)
        reduced = np.asarray(whole.image.resize(scaled.size, Image.Resampling.BOX), np.int32)
        assert np.abs(reduced - np.asarray(scaled.image, np.int32)).mean() < 1  # the same picture, scaled


def test_a_webp_bitstream_larger_than_its_counted_size_is_left_to_pillow() -> None:
    # An animation's ANMF and canvas can say 1000x800 around a 3000x2000 bitstream: the still made
    # of it must not be decoded at the bitstream's size while 800,000 pixels are counted.
    import struct

    from service.imaging.webp_scaled import first_frame, webp_scaled

    big = io.BytesIO()
    Image.new("RGB", (3000, 2000), (10, 20, 30)).save(big, "WEBP", lossless=True)
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (1000, 800), colour) for colour in ((1, 2, 3), (4, 5, 6))]
    frames[0].save(buffer, "WEBP", lossless=True, save_all=True, append_images=frames[1:])
    data = buffer.getvalue()
    at = data.index(b"ANMF")
    (size,) = struct.unpack_from("<I", data, at + 4)
    inner = data[at + 8 : at + 24] + big.getvalue()[big.getvalue().index(b"VP8L") :]
    anmf = b"ANMF" + struct.pack("<I", len(inner)) + inner + b"\0" * (len(inner) & 1)
    forged = bytearray(data[:at] + anmf + data[at + 8 + size + (size & 1) :])
    struct.pack_into("<I", forged, 4, len(forged) - 8)
    frame, honest = first_frame(bytes(forged)), first_frame(data)
    assert frame is not None and webp_scaled(frame.still, (1000, 800), (128, 128), alpha=False) is None
    assert honest is not None and webp_scaled(honest.still, (1000, 800), (128, 128), alpha=False) is not None
