"""Attention rollout with several tokens before the patch grid (issue 20): DeiT's distillation token, registers."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from service.imaging.attention import class_map, rollout, rollout_grid
from service.runtime.manifest import AttentionSpec


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


def test_the_manifest_field_defaults_to_one_class_token_and_needs_exactly_one() -> None:
    spec = AttentionSpec.model_validate({"output": "attentions", "grid": {"height": 2, "width": 2}})
    assert spec.prefix_tokens == ["class"]
    distilled = AttentionSpec(output="a", grid={"height": 2, "width": 2}, prefix_tokens=["class", "distillation"])
    assert distilled.prefix_tokens == ["class", "distillation"]
    for bad in (["register"], ["class", "class"], [], ["class", "cls"]):
        with pytest.raises(ValidationError):
            AttentionSpec(output="a", grid={"height": 2, "width": 2}, prefix_tokens=bad)


def test_a_class_activation_map_is_the_top_class_column_on_the_token_grid() -> None:
    scores = np.arange(12, dtype=np.float32).reshape(6, 2)  # 6 tokens (a 2x3 grid), 2 classes
    assert class_map(scores, (2, 3), 1).tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]
    with pytest.raises(ValueError, match="do not fit"):
        class_map(scores, (2, 2), 0)
    with pytest.raises(ValueError, match="do not fit"):
        class_map(scores, (2, 3), 2)
