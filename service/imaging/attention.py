"""Attention rollout and its heat map over the image, in numpy and Pillow (no torch, no matplotlib).

Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020,
Section 3): each block's attention, averaged over heads, is mixed with the identity for the
residual connection, ``A~ = 0.5 A + 0.5 I``, its rows renormalised, and the blocks'
matrices multiplied from the first to the last, ``R = A~_L ... A~_1``. The class token's row
of ``R`` says how much of its final representation flows from each input patch. Tokens other
than patches before the grid (DeiT's distillation token, DINOv2's registers) are the
manifest's ``attention.prefix_tokens``; their columns are left out of the picture.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from service.imaging.preprocess import Preprocessor
from service.imaging.render import bounded_font_size, displayed_canvas, png_bytes, scale_of

# Anchors of a dark-to-bright colour map (close to matplotlib's "inferno"), interpolated to 256.
_ANCHORS = np.array(
    [
        [0, 0, 4],
        [40, 11, 84],
        [101, 21, 110],
        [159, 42, 99],
        [212, 72, 66],
        [245, 125, 21],
        [250, 193, 39],
        [252, 255, 164],
    ],
    dtype=np.float32,
)
COLORMAP = np.stack(
    [np.interp(np.linspace(0, 1, 256), np.linspace(0, 1, len(_ANCHORS)), _ANCHORS[:, c]) for c in range(3)], axis=1
).astype(np.uint8)  # (256, 3) uint8 RGB


def rollout(attentions: np.ndarray, residual: float = 0.5, *, query: int = 0, prefix: int = 1) -> np.ndarray:
    """Attention rollout of one image (Abnar & Zuidema 2020), heads fused by their mean.

    Args:
        attentions: float (depth, heads, T, T), each row a softmax over keys; the first
            ``prefix`` tokens precede the patch tokens.
        residual: weight of the identity for the residual connection (the paper's 0.5).
        query: the token whose rolled-out attention is read (the class token, 0 in a ViT).
        prefix: how many tokens precede the patch grid (1: a class token; 2: DeiT's class and
            distillation tokens; 1 + registers: DINOv2 with registers). Their columns are
            dropped: the flow into register or distillation tokens is not a place in the image.

    Returns:
        float64 (T - prefix,): the query token's rolled-out attention to each patch token, in
        token order (row-major over the patch grid); non-negative.

    Raises:
        ValueError: ``attentions`` is not (depth, heads, T, T), or ``query``/``prefix`` do not fit T.
    """
    if attentions.ndim != 4 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(f"expected attentions (depth, heads, T, T), got {attentions.shape}")
    tokens = attentions.shape[-1]
    if not 0 <= query < prefix < tokens:
        raise ValueError(f"query token {query} and {prefix} prefix tokens do not fit {tokens} tokens")
    fused = attentions.astype(np.float64).mean(axis=1)  # (depth, T, T)
    mixed = (1 - residual) * fused + residual * np.eye(tokens)  # (depth, T, T)
    mixed /= mixed.sum(axis=-1, keepdims=True)
    flow = np.eye(tokens)
    for layer in mixed:  # R = A~_L ... A~_1
        flow = layer @ flow
    return flow[query, prefix:]


def rollout_grid(
    attentions: np.ndarray, grid: tuple[int, int], prefix_tokens: Sequence[str] = ("class",)
) -> np.ndarray:
    """:func:`rollout` of the class token laid out on the patch grid.

    Args:
        attentions: float (depth, heads, T, T) with T = len(prefix_tokens) + rows * cols.
        grid: (rows, cols) of patches over the model input.
        prefix_tokens: the kinds of the tokens before the grid, in order (the manifest's
            ``attention.prefix_tokens``: "class", "distillation", "register"); the class
            token's row is rolled out.

    Returns:
        float64 (rows, cols).

    Raises:
        ValueError: T does not match the grid and prefix, or there is no class token.
    """
    rows, cols = grid
    prefix = len(prefix_tokens)
    if "class" not in prefix_tokens:
        raise ValueError(f"prefix tokens {list(prefix_tokens)} have no class token to roll out")
    if attentions.shape[-1] != prefix + rows * cols:
        raise ValueError(
            f"{attentions.shape[-1]} tokens do not fit a {rows}x{cols} patch grid plus {prefix} prefix token(s) "
            f"{list(prefix_tokens)}"
        )
    return rollout(attentions, query=list(prefix_tokens).index("class"), prefix=prefix).reshape(rows, cols)


def heatmap_image(
    image: Image.Image,
    heat: np.ndarray,
    region: tuple[float, float, float, float],
    *,
    caption: str = "",
    alpha: float = 0.55,
    outside: float = 0.35,
) -> Image.Image:
    """The image with ``heat`` blended over the region the model saw.

    Args:
        image: the picture to draw on (any mode; drawn in RGB at its own size).
        heat: float (rows, cols), e.g. :func:`rollout_grid`; min-max scaled to the colour map
            (a constant map draws uniformly dark).
        region: (left, top, right, bottom) of ``image`` in pixels that the model input
            covered; the heat map is stretched over it (bilinear) and the rest is dimmed.
        caption: text drawn in the top-left corner ("" for none).
        alpha: opacity of the colour map over the region, in [0, 1].
        outside: brightness kept outside the region, in [0, 1].

    Returns:
        An RGB image of ``image.size``.
    """
    base = image.convert("RGB")
    width, height = base.size
    low, high = float(heat.min()), float(heat.max())
    scaled = (heat - low) / (high - low) if high > low else np.zeros_like(heat)
    left, top, right, bottom = (round(v) for v in region)
    left, top = max(0, left), max(0, top)
    right, bottom = min(width, max(right, left + 1)), min(height, max(bottom, top + 1))
    # All in 8 bits (3 bytes a pixel, whatever the photo's size): dim everything, then blend the
    # colour map over the region.
    inside = base.crop((left, top, right, bottom))  # (h, w) RGB
    levels = Image.fromarray(np.clip(scaled * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    index = np.asarray(levels.resize((right - left, bottom - top), Image.Resampling.BILINEAR))  # (h, w) uint8
    out = base.point(lambda v: int(v * outside + 0.5))
    out.paste(Image.blend(inside, Image.fromarray(COLORMAP[index], mode="RGB"), alpha), (left, top))
    if caption:
        draw = ImageDraw.Draw(out)
        font = ImageFont.load_default(size=bounded_font_size(height // 16, width, height))
        x0, y0, x1, y1 = draw.textbbox((0, 0), caption, font=font)
        pad = max(2, (y1 - y0) // 4)
        draw.rectangle((0, 0, x1 - x0 + 2 * pad, y1 - y0 + 2 * pad), fill=(0, 0, 0))
        draw.text((pad - x0, pad - y0), caption, fill=(255, 255, 255), font=font)
    return out


def render_png(
    image: Image.Image,
    size: tuple[int, int],
    attentions: np.ndarray,
    grid: tuple[int, int],
    preprocessor: Preprocessor,
    *,
    caption: str,
    prefix_tokens: Sequence[str] = ("class",),
) -> bytes:
    """The attention-rollout picture of one image, as PNG of its displayed size.

    Blocking (resizes and encodes): the route runs it on its render thread.

    Args:
        image: the decoded image (EXIF orientation applied), any mode; resized to ``size``
            when it was decoded smaller (a JPEG in draft mode).
        size: (width, height) of the image as the client displays it, in pixels.
        attentions: float32 (depth, heads, T, T), this image's row of the attention output.
        grid: (rows, cols) of the patch grid (the manifest's ``attention.grid``).
        preprocessor: the model's preprocessing (which region of the image the input covers).
        caption: text for the top-left corner, e.g. "cat 0.93".
        prefix_tokens: the tokens before the patch grid (the manifest's ``attention.prefix_tokens``).

    Returns:
        PNG bytes of an RGB picture of ``size``, scaled down to
        :data:`~service.imaging.render.MAX_PICTURE_PIXELS` when larger.
    """
    return render_heat_png(image, size, rollout_grid(attentions, grid, prefix_tokens), preprocessor, caption=caption)


def class_map(scores: np.ndarray, grid: tuple[int, int], class_id: int) -> np.ndarray:
    """One class's activation map (Zhou et al. 2016, CVPR, Sec. 2) from per-token class scores.

    Args:
        scores: float (N, num_labels), the head applied to each final token (the manifest's
            ``class_maps`` output for one image); their mean over N is the image's logits.
        grid: (rows, cols) of the final tokens, rows * cols = N, row-major.
        class_id: the class to map (the top prediction).

    Returns:
        float64 (rows, cols): the class's score at each token.

    Raises:
        ValueError: ``scores`` does not fit the grid or has no column ``class_id``.
    """
    rows, cols = grid
    if scores.ndim != 2 or scores.shape[0] != rows * cols or not 0 <= class_id < scores.shape[1]:
        raise ValueError(f"class scores {scores.shape} do not fit a {rows}x{cols} grid and class {class_id}")
    return scores[:, class_id].astype(np.float64).reshape(rows, cols)


def render_heat_png(
    image: Image.Image, size: tuple[int, int], heat: np.ndarray, preprocessor: Preprocessor, *, caption: str
) -> bytes:
    """``heat`` (rows, cols) over the region of the displayed image the model saw, as PNG of ``size`` (blocking).

    See :func:`render_png` for ``image``, ``size``, ``preprocessor`` and ``caption``.
    """
    canvas = displayed_canvas(image, size)
    sx, sy = scale_of(canvas, size)
    left, top, right, bottom = preprocessor.input_region(*size)
    region = (left * sx, top * sy, right * sx, bottom * sy)
    return png_bytes(heatmap_image(canvas, heat, region, caption=caption))
