"""Softmax (service/imaging/postprocess.py) on hand-computed values."""

from __future__ import annotations

import math

import numpy as np

from service.imaging.postprocess import softmax


def test_softmax_by_hand() -> None:
    p = softmax(np.array([0.0, math.log(3.0)], dtype=np.float32))
    np.testing.assert_allclose(p, [0.25, 0.75], rtol=1e-6)
    assert np.allclose(softmax(np.array([1000.0, 1000.0])), 0.5)  # no overflow
