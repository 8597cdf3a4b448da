"""models.box_bias: pairing true boxes with detections, and the size ratio by the input's side."""

from __future__ import annotations

import numpy as np

from models.box_bias import matched_pairs, size_ratio_table


def _detection(label: str, box: tuple[float, float, float, float]) -> dict:
    return {"label": label, "box": dict(zip(("xmin", "ymin", "xmax", "ymax"), box, strict=True))}


def test_each_true_box_pairs_with_its_labels_best_overlapping_detection() -> None:
    truth = [(np.array([[10.0, 10.0, 30.0, 30.0], [50.0, 50.0, 60.0, 60.0]]), np.array([1, 2]))]
    found = [[_detection("1", (11, 11, 31, 31)), _detection("2", (10, 10, 30, 30)), _detection("2", (80, 80, 90, 90))]]
    pairs = matched_pairs(truth, found, ["0", "1", "2"])
    assert len(pairs) == 1  # the "2" at the first box has the wrong label; the second box has no overlap
    index, true_box, predicted, iou = pairs[0]
    assert index == 0 and list(true_box) == [10, 10, 30, 30] and list(predicted) == [11, 11, 31, 31]
    assert iou == np.float64(19 * 19) / (2 * 400 - 19 * 19)


def test_the_table_reports_the_size_ratio_per_range_of_the_inputs_side() -> None:
    # Image 0 is 70 px wide and its box is predicted 10 % too wide; image 1 is 120 px wide and exact.
    pairs = [
        (0, np.array([0.0, 0.0, 20.0, 20.0]), np.array([0.0, 0.0, 22.0, 20.0]), 0.9),
        (1, np.array([0.0, 0.0, 20.0, 20.0]), np.array([0.0, 0.0, 20.0, 20.0]), 1.0),
    ]
    lines = size_ratio_table(pairs, np.array([[70.0, 100.0], [120.0, 100.0]]))
    assert "width | 60-79 | 1 | 0.900 | 1.100 (0.000)" in lines
    assert "width | 112-128 | 1 | 1.000 | 1.000 (0.000)" in lines
    assert "height | 96-111 | 2 | 0.950 | 1.000 (0.000)" in lines


def test_the_input_format_is_read_from_the_checkpoints_preprocessing() -> None:
    from models.box_bias import input_format
    from models.detr_inputs import INPUT_FORMATS

    for name, fmt in INPUT_FORMATS.items():
        assert input_format({"pixel_mask": fmt.mask, "preprocessing": fmt.preprocessing()}) == name
