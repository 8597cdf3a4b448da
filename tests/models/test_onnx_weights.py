"""A served CIFAR-10 DeiT's weights recovered from its ONNX graph, and fine-tuned on a finer grid."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

pytestmark = pytest.mark.slow


def test_a_served_deit_is_recovered_from_its_graph_and_fine_tunes_on_a_finer_grid(tmp_path, cifar_archive) -> None:
    from export.checkpoint import export_checkpoint
    from models.onnx_weights import recover
    from models.train_cifar import train
    from models.vit import ViT, ViTConfig

    small = {"epochs": 1, "batch_size": 16, "data": cifar_archive, "limit_per_class": 4, "compile": False}
    train(tmp_path / "cnn", arch="cnn", quiet=True, **small)
    teacher = tmp_path / "cnn" / "checkpoint.pt"
    train(tmp_path / "deit", arch="deit", teacher=teacher, erase=0.25, quiet=True, **small)
    trained = torch.load(tmp_path / "deit" / "checkpoint.pt", weights_only=False)
    export_checkpoint(tmp_path / "deit" / "checkpoint.pt", tmp_path / "repo" / "2", opset=18)

    recovered = recover(tmp_path / "repo" / "2", data=cifar_archive, limit_per_class=4, images=40)
    assert recovered["architecture"] == "deit" and recovered["config"] == trained["config"]
    assert recovered["metrics"]["onnx_max_abs_diff"] <= 1e-4
    # every parameter outside the stem's BatchNorm-folded convs comes back exactly, the
    # transposed MatMul weights included
    stem_conv_bn = ("patch_embed.0.", "patch_embed.1.", "patch_embed.3.", "patch_embed.4.")
    stem_conv_bn += ("patch_embed.6.", "patch_embed.7.")
    same = [name for name in trained["state_dict"] if not name.startswith(stem_conv_bn)]
    assert "blocks.5.attn.qkv.weight" in same and "head_dist.weight" in same
    for name in same:
        assert torch.equal(recovered["state_dict"][name], trained["state_dict"][name]), name
    # the unfolded stem computes what the trained one did, in eval mode
    original, copy = ViT(ViTConfig(**trained["config"])), ViT(ViTConfig(**recovered["config"]))
    original.load_state_dict(trained["state_dict"])
    copy.load_state_dict(recovered["state_dict"])
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(copy.eval()(x), original.eval()(x), atol=1e-4)
        # and in training mode the BatchNorm normalises by batch statistics close to its running ones
        assert torch.allclose(
            recovered["state_dict"]["patch_embed.1.weight"] ** 2,
            recovered["state_dict"]["patch_embed.1.running_var"] + 1e-5,
            rtol=1e-4,
        )

    torch.save(recovered, tmp_path / "v2.pt")
    metrics = train(
        tmp_path / "finer", arch="deit", teacher=teacher, init=tmp_path / "v2.pt", upsample=2, quiet=True, **small
    )
    assert metrics["initialised_from"] == str(tmp_path / "v2.pt")
    finer = torch.load(tmp_path / "finer" / "checkpoint.pt", weights_only=False)
    assert finer["config"]["upsample"] == 2 and finer["state_dict"]["pos_embed"].shape == (1, 2 + 64, 192)
    manifest = export_checkpoint(tmp_path / "finer" / "checkpoint.pt", tmp_path / "repo" / "3", opset=18)
    assert manifest.input.shape == ["batch", 3, 32, 32]  # the server's input is unchanged
    assert manifest.attention is not None and (manifest.attention.grid.height, manifest.attention.grid.width) == (8, 8)
    assert "enlarged 2x" in manifest.description
    session = ort.InferenceSession(str(tmp_path / "repo" / "3" / "model.onnx"), providers=["CPUExecutionProvider"])
    attentions = session.run(["attentions"], {"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})[0]
    assert attentions.shape == (1, 6, 3, 66, 66)
    assert json.loads((tmp_path / "repo" / "3" / "model.json").read_text())["attention"]["grid"] == {
        "height": 8,
        "width": 8,
    }


def test_recovery_refuses_a_graph_that_is_not_the_cifar10_vit(tmp_path) -> None:
    from models.onnx_weights import RecoveryError, recover

    (tmp_path / "model.json").write_text(json.dumps({"input": {"shape": ["batch", 3, 64, 64]}, "attention": None}))
    with pytest.raises(RecoveryError, match="is not the CIFAR-10 ViT's"):
        recover(tmp_path)
