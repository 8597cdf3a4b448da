"""Resize policies are found through their registry (STYLE item 13): one class each, named in one place."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from PIL import Image

from service.imaging import resize
from service.imaging.preprocess import Preprocessor
from service.imaging.spec import Preprocessing
from tests.conftest import ROOT


def test_the_built_in_policies_are_registered() -> None:
    assert resize.names() == ["stretch", "letterbox", "shortest_edge", "center_crop"]
    assert [p.name for p in (resize.STRETCH, resize.LETTERBOX, resize.SHORTEST_EDGE, resize.CENTER_CROP)] == (
        resize.names()
    )
    assert [name for name in resize.names() if resize.get(name).crops] == ["center_crop"]


def test_no_policy_name_is_spelled_in_service_outside_the_registry() -> None:
    names = set(resize.names())
    found = []
    for path in (ROOT / "service").rglob("*.py"):
        where = path.relative_to(ROOT).as_posix()
        if where == "service/imaging/resize.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=where)):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert found == [], "ask service.imaging.resize (get(spec.resize)) instead:\n" + "\n".join(found)


class _Mirror(resize.ResizePolicy):
    """A toy policy: stretch, then mirror left to right (a new policy is one class and one register)."""

    name = "mirror"

    def resized(self, pre: Preprocessor, image: Image.Image, target: tuple[int, int]) -> Image.Image:
        return super().resized(pre, image, target).transpose(Image.Transpose.FLIP_LEFT_RIGHT)


@pytest.fixture
def mirror() -> resize.ResizePolicy:
    policy = resize.register(_Mirror())
    yield policy
    resize.unregister(policy.name)


def test_a_registered_policy_is_validated_and_served(mirror: resize.ResizePolicy) -> None:
    spec = Preprocessing(color_mode="L", resize="mirror", size={"height": 2, "width": 3}, mean=[0], std=[1], scale=1)
    pre = Preprocessor(spec)
    image = Image.fromarray(np.array([[1, 2, 3], [4, 5, 6]], np.uint8))
    assert pre(image)[0].tolist() == [[3, 2, 1], [6, 5, 4]]
    with pytest.raises(ValueError, match="the mirror policy needs size"):
        Preprocessing(color_mode="L", resize="mirror", mean=[0], std=[1])


def test_an_unknown_policy_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown resize policy 'squash'; registered: stretch, letterbox"):
        Preprocessing(color_mode="L", resize="squash", size={"height": 2, "width": 2}, mean=[0], std=[1])
