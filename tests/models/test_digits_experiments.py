"""The digits experiments' logic: patch shuffling by hand, the permutation invariance it tests, the table."""

from __future__ import annotations

import json

import numpy as np
import torch

from models.digits_experiments import REFERENCE, predict, shuffle_patches, table
from models.vit import build


def test_shuffle_patches_moves_whole_patches() -> None:
    image = np.arange(16).reshape(1, 4, 4)  # 2x2 patches: [[0,1,4,5], [2,3,6,7], [8,9,12,13], [10,11,14,15]]
    patches = {
        (0, 0): [[0, 1], [4, 5]],
        (0, 1): [[2, 3], [6, 7]],
        (1, 0): [[8, 9], [12, 13]],
        (1, 1): [[10, 11], [14, 15]],
    }
    rng = np.random.default_rng(0)
    order = np.random.default_rng(0).permutation(4)
    out = shuffle_patches(image, 2, rng)[0]
    for k in range(4):
        r, c = divmod(k, 2)
        source = divmod(int(order[k]), 2)
        assert out[2 * r : 2 * r + 2, 2 * c : 2 * c + 2].tolist() == patches[source]
    assert sorted(out.ravel().tolist()) == list(range(16))


def test_each_image_gets_its_own_permutation() -> None:
    images = np.tile(np.arange(64, dtype=np.uint8).reshape(1, 8, 8), (50, 1, 1))
    out = shuffle_patches(images, 2, np.random.default_rng(1))
    assert len({o.tobytes() for o in out}) == 50
    assert all(sorted(o.ravel().tolist()) == list(range(64)) for o in out)


def test_without_positions_shuffling_changes_nothing_with_them_it_does() -> None:
    torch.manual_seed(0)
    images = np.random.default_rng(0).integers(0, 256, (64, 8, 8), dtype=np.uint8)
    shuffled = shuffle_patches(images, 2, np.random.default_rng(1))
    no_pos, with_pos = build("digits", position_embedding=False).eval(), build("digits").eval()
    x, xs = (torch.from_numpy(a).float().unsqueeze(1) / 255 for a in (images, shuffled))
    with torch.no_grad():
        assert torch.allclose(no_pos(x), no_pos(xs), atol=1e-5)
        assert not torch.allclose(with_pos(x), with_pos(xs), atol=1e-3)
    assert (predict(no_pos, images) == predict(no_pos, shuffled)).all()


def fake_results(seeds: list[int], changed: list[int]) -> dict:
    accuracy = {seed: 0.5 + 0.1 * i for i, seed in enumerate(seeds)}
    values = list(accuracy.values())
    run = {"test_accuracy": accuracy, "mean": float(np.mean(values)), "std": float(np.std(values))}
    return {
        "seeds": seeds,
        "runs": {name: run for name in ("vit", "vit-no-pos", "vit-150", "cnn-150")},
        "shuffle": {
            "vit": {seed: {"changed": c, "images": 360} for seed, c in zip(seeds, changed, strict=True)},
            "vit-no-pos": {seed: {"changed": 0, "images": 360} for seed in seeds},
        },
    }


def test_table_lists_every_experiment_beside_the_reference() -> None:
    text = table(fake_results([8], [300]))
    assert text.count("\n") == 7  # header, rule, 4 accuracies, 2 shuffle rows
    assert "| 300 of 360 | 304 of 360 change |" in text and "| 0 of 360 | none change |" in text
    assert REFERENCE["vit-no-pos"] in text and "| seed 8 |" in text
    assert "| 0.500 | 0.725 |" in text


def test_table_with_several_seeds_shows_the_first_and_the_mean() -> None:
    results = fake_results([8, 0], [300, 310])
    text = table(results)
    assert "| seed 8 | 2 seeds (8, 0) | reference |" in text
    assert "| 0.500 | 0.550 ± 0.050 | 0.725 |" in text
    assert "| 300 of 360 | 300 / 310 of 360 | 304 of 360 change |" in text
    as_json = json.loads(json.dumps(results))  # seeds become string keys when read back
    assert table(as_json) == text
