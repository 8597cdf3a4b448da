"""Attention rollout (Abnar & Zuidema 2020) on hand-made attention, with tokens before the patch grid
(issue 20: DeiT's distillation token, registers), and the heat-map picture."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from service.imaging.attention import COLORMAP, class_map, heatmap_image, png_bytes, render_png, rollout, rollout_grid
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing


def uniform(depth: int, heads: int, tokens: int) -> np.ndarray:
    return np.full((depth, heads, tokens, tokens), 1.0 / tokens)


def test_rollout_by_hand_one_block() -> None:
    # One block, 3 tokens; the class token attends 0.2 / 0.8 to patches 1 and 2 in head 0,
    # only to itself in head 1. Mean: [0.5, 0.1, 0.4]; with the residual: 0.5 * that + 0.5 * I.
    attention = np.zeros((1, 2, 3, 3))
    attention[0, 0] = [[0.0, 0.2, 0.8], [0, 1, 0], [0, 0, 1]]
    attention[0, 1] = np.eye(3)
    assert rollout(attention) == pytest.approx([0.05, 0.2])


def test_rollout_by_hand_two_blocks() -> None:
    # Block 1: every token attends to patch 1 only; block 2: the class token attends to patch 2 only.
    a1 = np.zeros((3, 3))
    a1[:, 1] = 1.0
    a2 = np.eye(3)
    a2[0] = [0.0, 0.0, 1.0]
    attention = np.stack([a1[None], a2[None]])  # (2, 1, 3, 3)
    m1 = 0.5 * a1 + 0.5 * np.eye(3)
    m2 = 0.5 * a2 + 0.5 * np.eye(3)
    expected = (m2 @ m1)[0, 1:]
    assert rollout(attention) == pytest.approx(expected)
    assert expected == pytest.approx([0.5, 0.25])  # 0.5*0.5 (via itself) + 0.5*0.5 (via patch 2)


def test_rollout_of_uniform_attention_is_flat_and_the_grid_is_row_major() -> None:
    flow = rollout(uniform(4, 3, 1 + 6))
    assert np.allclose(flow, flow[0]) and flow[0] > 0
    attention = uniform(1, 1, 1 + 6)
    attention[0, 0, 0] = 0.0
    attention[0, 0, 0, 1 + 4] = 1.0  # grid (2, 3): token 1 + 4 is row 1, column 1
    grid = rollout_grid(attention, (2, 3))
    assert grid.shape == (2, 3) and np.unravel_index(np.argmax(grid), grid.shape) == (1, 1)
    with pytest.raises(ValueError, match="patch grid"):
        rollout_grid(attention, (3, 3))
    with pytest.raises(ValueError, match="depth, heads"):
        rollout(np.zeros((3, 3)))


def test_heatmap_keeps_the_size_colours_the_region_and_dims_the_rest() -> None:
    image = Image.new("RGB", (40, 20), (200, 200, 200))
    heat = np.zeros((2, 2))
    heat[0, 1] = 1.0  # hottest: top-right of the region
    out = np.asarray(heatmap_image(image, heat, region=(10, 0, 30, 20)))
    assert out.shape == (20, 40, 3)
    assert out[10, 2].tolist() == [70, 70, 70]  # outside: 200 * 0.35
    hot, cold = out[1, 28].astype(float), out[18, 11].astype(float)
    blend = lambda c: 0.45 * 200 + 0.55 * COLORMAP[c].astype(float)  # noqa: E731
    assert hot == pytest.approx(blend(255), abs=1.5) and cold == pytest.approx(blend(0), abs=1.5)


def test_heatmap_caption_and_png() -> None:
    out = heatmap_image(Image.new("L", (64, 48), 128), np.ones((4, 4)), (0, 0, 64, 48), caption="cat 0.93")
    assert out.mode == "RGB" and out.size == (64, 48)
    decoded = Image.open(io.BytesIO(png_bytes(out)))
    assert decoded.format == "PNG" and decoded.size == (64, 48)
    assert np.asarray(decoded)[:4, :4].max() == 0  # the caption's black box in the top-left corner


def test_render_png_has_the_displayed_size_of_a_draft_decoded_image() -> None:
    spec = Preprocessing(
        color_mode="RGB", resize="center_crop", size={"height": 8, "width": 8}, mean=[0, 0, 0], std=[1, 1, 1]
    )
    small = Image.new("RGB", (15, 30), (10, 120, 200))  # decoded at half the displayed 30x60
    png = render_png(small, (30, 60), uniform(2, 2, 1 + 4), (2, 2), Preprocessor(spec), caption="")
    picture = Image.open(io.BytesIO(png))
    assert picture.format == "PNG" and picture.mode == "RGB" and picture.size == (30, 60)
    pixels = np.asarray(picture).astype(int)
    # Centre crop of a 30x60 image: the middle 30x30 is the model's view; above and below are dimmed.
    assert pixels[5, 15].tolist() == [round(10 * 0.35), round(120 * 0.35), round(200 * 0.35)]
    assert pixels[30, 15].sum() > pixels[5, 15].sum()


def one_block(tokens: int) -> np.ndarray:
    return np.eye(tokens)[None, None].copy()  # (depth 1, heads 1, T, T): every token attends to itself


def test_register_columns_are_left_out_and_the_class_row_is_read() -> None:
    # 1 class token, 2 registers, a 1x2 grid. The class token attends 0.6 to register 1, 0.4 to patch 1.
    attention = one_block(5)
    attention[0, 0, 0] = [0.0, 0.6, 0.0, 0.0, 0.4]
    heat = rollout_grid(attention, (1, 2), ["class", "register", "register"])
    # A~ = 0.5 A + 0.5 I: row 0 = [0.5, 0.3, 0, 0, 0.2]; the grid keeps columns 3 and 4.
    assert heat.shape == (1, 2) and heat.ravel().tolist() == pytest.approx([0.0, 0.2])
    assert rollout(attention, query=0, prefix=3).tolist() == pytest.approx([0.0, 0.2])


def test_a_distillation_token_second_is_not_a_patch() -> None:
    # DeiT: class, distillation, then a 2x2 grid. Read as one class token, the grid would be off by one.
    attention = one_block(6)
    attention[0, 0, 0] = [0.0, 0.5, 0.5, 0.0, 0.0, 0.0]  # class -> distillation and the first patch
    heat = rollout_grid(attention, (2, 2), ["class", "distillation"])
    assert heat.ravel().tolist() == pytest.approx([0.25, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"2x2 patch grid plus 1 prefix token"):
        rollout_grid(attention, (2, 2))  # the old one-class-token reading does not fit 6 tokens
    with pytest.raises(ValueError, match="no class token"):
        rollout_grid(attention, (2, 2), ["register", "register"])
    with pytest.raises(ValueError, match="do not fit"):
        rollout(attention, query=0, prefix=6)


def test_a_class_activation_map_is_the_top_class_column_on_the_token_grid() -> None:
    scores = np.arange(12, dtype=np.float32).reshape(6, 2)  # 6 tokens (a 2x3 grid), 2 classes
    assert class_map(scores, (2, 3), 1).tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    with pytest.raises(ValueError, match="do not fit"):
        class_map(scores, (2, 2), 0)
    with pytest.raises(ValueError, match="do not fit"):
        class_map(scores, (2, 3), 2)
