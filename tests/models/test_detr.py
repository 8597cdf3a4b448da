"""DETR: the tensor contract, the position encoding, the backbones, DETR-R50's size."""

from __future__ import annotations

import math

import pytest
import torch

from models.backbone import ConvBackbone, FrozenBatchNorm2d, ResNet50
from models.detr import CONFIGS, DETRForExport, build, config_dict, config_from_dict, count_parameters
from models.position_encoding import PositionEmbeddingSine


def test_small_detr_output_contract() -> None:
    torch.manual_seed(0)
    model = build("digits-small").eval()
    config = model.config
    with torch.no_grad():
        out = model(torch.randn(3, 1, 128, 128))
    assert out["pred_logits"].shape == (3, config.num_queries, config.num_classes + 1) == (3, 25, 11)
    assert out["pred_boxes"].shape == (3, 25, 4)
    assert out["pred_boxes"].min() >= 0 and out["pred_boxes"].max() <= 1  # sigmoid, normalised cxcywh
    assert len(out["aux_outputs"]) == config.num_decoder_layers - 1
    assert all(a["pred_logits"].shape == (3, 25, 11) for a in out["aux_outputs"])
    logits, boxes = DETRForExport(model)(torch.randn(2, 1, 128, 128))
    assert logits.shape == (2, 25, 11) and boxes.shape == (2, 25, 4)


def test_a_batch_gives_each_image_what_it_gets_alone() -> None:
    torch.manual_seed(0)
    model = build("digits-small").eval()
    images = torch.randn(4, 1, 128, 128)
    with torch.no_grad():
        together = model(images)["pred_boxes"]
        alone = torch.cat([model(images[i : i + 1])["pred_boxes"] for i in range(4)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


def test_small_backbone_reaches_an_8x8_map() -> None:
    config = CONFIGS["digits-small"]
    backbone = ConvBackbone(1, config.backbone_channels, config.backbone_strides)
    assert len(config.backbone_channels) == 6 and backbone.stride == 16
    assert backbone(torch.randn(1, 1, 128, 128)).shape == (1, 128, 8, 8)


def test_resnet50_gives_c5_at_stride_32_with_frozen_norms() -> None:
    resnet = ResNet50().eval()
    with torch.no_grad():
        assert resnet(torch.randn(1, 3, 64, 96)).shape == (1, 2048, 2, 3)
    assert sum(isinstance(m, FrozenBatchNorm2d) for m in resnet.modules()) == 53  # 1 stem + 16 blocks x 3 + 4 shortcuts
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in resnet.modules())
    # torchvision's names, so its weights load by name.
    names = set(resnet.state_dict())
    assert {"conv1.weight", "bn1.running_mean", "layer1.0.downsample.0.weight", "layer4.2.conv3.weight"} <= names


def test_small_detr_parameter_count() -> None:
    assert count_parameters(build("digits-small")) == 1_869_039


def test_detr_r50_parameter_count() -> None:
    model = build("detr-r50")
    total = count_parameters(model)
    assert total == 41_524_768
    # DETR trains ResNet-50 without its stem and first stage (frozen, as in its backbone.py);
    # the trainable count is the paper's "41.3M".
    frozen = sum(p.numel() for n, p in model.backbone.named_parameters() if n.startswith(("conv1", "layer1")))
    assert round((total - frozen) / 1e6, 1) == 41.3
    assert count_parameters(model.backbone) == 23_454_912  # ResNet-50 without fc and batch-norm affines


def test_sine_position_encoding_by_hand() -> None:
    pos = PositionEmbeddingSine(num_pos_feats=4, normalize=True)(torch.zeros(2, 7, 2, 4))
    assert pos.shape == (2, 8, 2, 4)
    # Channel 0: sin of the row's normalised position at the lowest frequency (dim_t = 1).
    row, col = 1, 2  # 0-based; DETR counts positions from 1
    y = (row + 1) / (2 + 1e-6) * 2 * math.pi
    x = (col + 1) / (4 + 1e-6) * 2 * math.pi
    assert pos[0, 0, row, col].item() == pytest.approx(math.sin(y), abs=1e-6)
    assert pos[0, 1, row, col].item() == pytest.approx(math.cos(y), abs=1e-6)
    # Channels 2, 3: frequency 1 / 10000^(2/4) = 1/100; channels 4-7: the column.
    assert pos[0, 2, row, col].item() == pytest.approx(math.sin(y / 100), abs=1e-6)
    assert pos[0, 4, row, col].item() == pytest.approx(math.sin(x), abs=1e-6)
    assert pos[0, 7, row, col].item() == pytest.approx(math.cos(x / 100), abs=1e-6)
    assert torch.equal(pos[0], pos[1])


def test_config_round_trips_through_a_checkpoint_dict() -> None:
    config = CONFIGS["digits-small"]
    assert config_from_dict(config_dict(config)) == config


def test_unknown_config_is_refused() -> None:
    with pytest.raises(ValueError, match="known"):
        build("detr-r101")


def test_an_all_valid_pixel_mask_changes_nothing() -> None:
    import torch

    from models.detr import build

    torch.manual_seed(0)
    model = build("digits-small").eval()
    x = torch.randn(2, 1, 128, 96)
    with torch.no_grad():
        plain = model(x)
        masked = model(x, torch.ones(2, 128, 96))
    assert torch.allclose(plain["pred_logits"], masked["pred_logits"], atol=1e-5)
    assert torch.allclose(plain["pred_boxes"], masked["pred_boxes"], atol=1e-6)


def test_the_sine_encoding_of_a_padded_map_is_the_unpadded_ones_on_its_pixels() -> None:
    """Carion et al. 2020, Sec. 4 / appendix A.3: positions are normalised by the valid extent."""
    import torch

    from models.position_encoding import PositionEmbeddingSine

    encode = PositionEmbeddingSine(16)
    alone = encode(torch.zeros(1, 1, 6, 5))  # (1, 32, 6, 5)
    mask = torch.ones(1, 9, 8, dtype=torch.bool)
    mask[:, :6, :5] = False  # 6x5 valid at the top left of a 9x8 canvas
    padded = encode(torch.zeros(1, 1, 9, 8), mask)
    assert torch.allclose(padded[..., :6, :5], alone, atol=1e-6)


def test_the_transformer_ignores_what_is_padded() -> None:
    """The decoder's output for an image is the same alone and padded with its mask."""
    import torch

    from models.position_encoding import PositionEmbeddingSine
    from models.transformer import Transformer

    torch.manual_seed(0)
    for normalize_before in (False, True):
        transformer = Transformer(32, 4, 2, 2, 64, dropout=0.0, normalize_before=normalize_before).eval()
        encode, queries = PositionEmbeddingSine(16), torch.randn(7, 32)
        src = torch.randn(1, 32, 4, 3)
        padded = torch.randn(1, 32, 6, 5) * 10  # garbage where the padding is
        padded[..., :4, :3] = src
        mask = torch.ones(1, 6, 5, dtype=torch.bool)
        mask[:, :4, :3] = False
        with torch.no_grad():
            alone = transformer(src, queries, encode(src))
            masked = transformer(padded, queries, encode(padded, mask), mask)
        assert torch.allclose(alone, masked, atol=1e-5)


def _grouped(groups: int = 3, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build("digits-small", num_groups=groups, num_queries=5, **overrides)


def test_group_detr_trains_k_groups_and_infers_with_group_0_only() -> None:
    """Chen et al. 2023, Sec. 3.2: K * N queries in training, N at inference, same heads."""
    model = _grouped(3)
    x = torch.randn(2, 1, 128, 128)
    with torch.no_grad():
        model.train().backbone.eval()  # batch norm on its running statistics, as at inference
        trained = model(x)
        served = model.eval()(x)
    assert trained["pred_logits"].shape == (2, 15, 11) and trained["pred_boxes"].shape == (2, 15, 4)
    assert all(a["pred_boxes"].shape == (2, 15, 4) for a in trained["aux_outputs"])
    assert served["pred_logits"].shape == (2, 5, 11) and served["pred_boxes"].shape == (2, 5, 4)
    # Within-group attention only: group 0 decodes in training exactly as it does alone at inference.
    torch.testing.assert_close(trained["pred_boxes"][:, :5], served["pred_boxes"], atol=1e-5, rtol=0)
    torch.testing.assert_close(trained["pred_logits"][:, :5], served["pred_logits"], atol=1e-5, rtol=0)


def test_group_detr_blocks_attention_across_groups() -> None:
    model = _grouped(2).train()
    queries, mask = model.queries()
    assert queries.shape == (10, 128) and mask.shape == (10, 10)
    assert mask[:5, :5].all() and mask[5:, 5:].all() and not mask[:5, 5:].any() and not mask[5:, :5].any()
    x = torch.randn(1, 1, 128, 128)
    with torch.no_grad():
        before = model(x)
        model.query_embed.weight[5:] += 3.0  # change only group 1's queries
        after = model(x)
    torch.testing.assert_close(before["pred_boxes"][:, :5], after["pred_boxes"][:, :5], atol=1e-6, rtol=0)
    assert not torch.allclose(before["pred_boxes"][:, 5:], after["pred_boxes"][:, 5:], atol=1e-3)


def test_for_inference_keeps_group_0_and_the_plain_detr_graph() -> None:
    from models.detr import for_inference

    model = _grouped(3).eval()
    inference = for_inference(model)
    assert inference.config.num_groups == 1 and inference.query_embed.weight.shape == (5, 128)
    x = torch.randn(2, 1, 128, 128)
    with torch.no_grad():
        torch.testing.assert_close(inference(x)["pred_boxes"], model(x)["pred_boxes"], atol=0, rtol=0)
        plain = build("digits-small", num_queries=5)
        plain.load_state_dict(inference.state_dict())  # the same weights as a plain DETR's: export unchanged
        torch.testing.assert_close(plain.eval()(x)["pred_logits"], model(x)["pred_logits"], atol=0, rtol=0)


@pytest.mark.slow  # a dynamo export: ~40 s on a busy CPU
def test_group_detr_exports_to_onnx_with_the_plain_shapes(tmp_path) -> None:
    """The eval-mode graph of a grouped model exports as the server's (N queries) and matches PyTorch."""
    import onnxruntime as ort

    from export.onnx_export import export_onnx, parity

    model = _grouped(2).eval()
    graph = DETRForExport(model).eval()
    x = torch.randn(3, 1, 128, 128)
    path = tmp_path / "model.onnx"
    export_onnx(graph, x[:2], path, output_names=("pred_logits", "pred_boxes"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.shape[1:] for o in session.get_outputs()] == [[5, 11], [5, 4]]
    assert max(parity(graph, path, [x[:1], x]).values()) < 1e-4


def test_a_sigmoid_head_has_no_no_object_output_and_starts_at_the_focal_prior() -> None:
    """Lin et al. 2017, Sec. 4.1: the class bias starts at -log((1 - 0.01) / 0.01)."""
    torch.manual_seed(0)
    model = build("digits-small", class_head="sigmoid").eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 1, 128, 128))
    assert out["pred_logits"].shape == (1, 25, 10)
    torch.testing.assert_close(model.class_embed.bias, torch.full((10,), -math.log(99.0)))


def test_config_overrides_parse_to_the_fields_types() -> None:
    from models.detr import parse_overrides

    assert parse_overrides(["num_queries=100", "num_decoder_layers=6", "dropout=0.1", "aux_loss=false"]) == {
        "num_queries": 100,
        "num_decoder_layers": 6,
        "dropout": 0.1,
        "aux_loss": False,
    }
    assert parse_overrides(["backbone_strides=2,2,1"]) == {"backbone_strides": (2, 2, 1)}
    with pytest.raises(ValueError, match="DETRConfig field"):
        parse_overrides(["num_querys=100"])
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_overrides(["num_queries"])


def test_a_fixed_frame_is_detrs_own_on_an_unpadded_input_of_the_frames_size() -> None:
    """fixed_frame=128 on a 128x128 input without padding: frame and valid extent are the same."""
    torch.manual_seed(0)
    plain = build("digits-small").eval()
    framed = build("digits-small", fixed_frame=128).eval()
    framed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 1, 128, 128)
    with torch.no_grad():
        a, b = plain(x), framed(x, torch.ones(2, 128, 128, dtype=torch.int64))
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], atol=1e-6, rtol=0)
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"], atol=1e-5, rtol=0)


def test_a_fixed_frame_encodes_positions_in_frame_units_and_rescales_boxes_to_the_image() -> None:
    """With fixed_frame F the encoding's cell i sits at i * stride / F * 2 pi whatever the image's
    extent, and a box the head puts at frame units b comes out as b * F / extent of the image."""
    encode = PositionEmbeddingSine(num_pos_feats=4)
    mask = torch.ones(1, 5, 8, dtype=torch.bool)
    mask[:, :3, :6] = False  # 3x6 valid cells at the top left
    pos = encode(torch.zeros(1, 1, 5, 8), mask, extent=torch.tensor([[8.0, 8.0]]))  # F / stride = 8 cells
    row, col = 2, 5
    assert pos[0, 0, row, col].item() == pytest.approx(math.sin((row + 1) / 8 * 2 * math.pi), abs=1e-6)
    assert pos[0, 4, row, col].item() == pytest.approx(math.sin((col + 1) / 8 * 2 * math.pi), abs=1e-6)

    torch.manual_seed(0)
    framed = build("digits-small", fixed_frame=128).eval()
    image = torch.randn(1, 1, 128, 80)
    padded = torch.zeros(1, 1, 128, 128)
    padded[..., :80] = image
    mask = torch.zeros(1, 128, 128, dtype=torch.int64)
    mask[..., :80] = 1
    raw = {}
    framed.bbox_embed.register_forward_hook(lambda module, args, out: raw.update(boxes=out.sigmoid()[-1]))
    with torch.no_grad():
        boxes = framed(padded, mask)["pred_boxes"]
    expected = raw["boxes"] * torch.tensor([128 / 80, 1.0, 128 / 80, 1.0])  # x and width over 80 px, not 128
    torch.testing.assert_close(boxes, expected, atol=1e-6, rtol=0)


def test_a_fixed_frame_gives_an_image_the_same_boxes_in_any_bucket() -> None:
    """The valid extent comes from the mask, so the padding never scales a box (issue 18, item 3)."""
    torch.manual_seed(0)
    framed = build("digits-small", fixed_frame=128).eval()
    image = torch.randn(1, 1, 96, 80)
    outputs = []
    for height, width in ((96, 80), (96, 96), (128, 128)):
        padded = torch.zeros(1, 1, height, width)
        padded[..., :96, :80] = image
        mask = torch.zeros(1, height, width, dtype=torch.int64)
        mask[..., :96, :80] = 1
        with torch.no_grad():
            outputs.append(framed(padded, mask)["pred_boxes"])
    # Only the backbone's convolutions see the padding (its zeros after batch norm): DETR's own tolerance.
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0], atol=1e-3, rtol=0)


def test_a_fixed_frame_smaller_than_the_input_is_refused() -> None:
    with pytest.raises(ValueError, match="fixed_frame 96 is smaller than the input"):
        build("digits-small", fixed_frame=96)
