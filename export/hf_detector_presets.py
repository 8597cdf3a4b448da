"""Random-weight presets of the DETR family (:mod:`export.hf_detectors`), added to :data:`export.hf_presets.PRESETS`.

    python -m export.hf_presets rtdetr-r50vd --out runs/hf/rtdetr-r50vd

The realistic presets are transformers 5.24's config defaults for each architecture, which its
docstrings give as the sizes of a hub checkpoint (PekingU/rtdetr_r50vd: RTDetrConfig's defaults, ResNet-50-vd,
ustc-community/dfine-xlarge-coco, AnnaZhang/lwdetr_small_60e_coco, Roboflow/rf-detr-base), or the sizes
written here (hustvl/yolos-tiny; Conditional and Deformable DETR at their ResNet-50 sizes with
transformers' own ResNet-50: the hub's microsoft/conditional-detr-resnet-50 and SenseTime/deformable-detr
use timm's, which is refused here), with each processor's published input size. No hub file could be
read here, so they are not checked against the hub's.

The ``tiny-*`` presets are small versions of the same architectures for tests: the RT-DETR family's
``initializer_range`` is 0.2 because at the published 0.01 (or 0.02) a 32-wide random model's
features are so small that LayerNorm maps them all onto its bias, every query scores the same and the
query selection's top-k (RT-DETR's, D-FINE's) is decided by ties, which ONNX Runtime and PyTorch
break differently. D-FINE's tiny preset also gets seeded noise (N(0, 0.02)) added to every parameter
that transformers initialises to one constant (its zero-initialised box-distribution and quality
heads), for the same reason (:func:`jitter_constants`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from export import hf_presets
from export.hf_presets import COCO_91, IMAGENET_MEAN, IMAGENET_STD, _labels

COCO_80 = [name for name in COCO_91 if name != "N/A"]
_TINY = ["cat", "dog", "cup"]
_RESNET_STAGES = ["stage2", "stage3", "stage4"]


def _processor(kind: str, size: dict[str, int], normalize: bool = True) -> dict[str, Any]:
    return {
        "do_normalize": normalize,
        "do_pad": kind != "RTDetrImageProcessor",
        "do_rescale": True,
        "do_resize": True,
        "format": "coco_detection",
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": kind,
        "image_std": IMAGENET_STD,
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": size,
    }


def _rtdetr_resnet(embedding: int, hidden: list[int], depths: list[int], layer_type: str) -> dict[str, Any]:
    return {
        "model_type": "rt_detr_resnet",
        "embedding_size": embedding,
        "hidden_sizes": hidden,
        "depths": depths,
        "layer_type": layer_type,
        "out_features": _RESNET_STAGES,
    }


def _resnet(embedding: int, hidden: list[int], depths: list[int], layer_type: str, stages: list[str]) -> dict:
    return {
        "model_type": "resnet",
        "embedding_size": embedding,
        "hidden_sizes": hidden,
        "depths": depths,
        "layer_type": layer_type,
        "out_features": stages,
    }


def _config(architecture: str, model_type: str, labels: list[str], **fields: Any) -> dict[str, Any]:
    return {"architectures": [architecture], "model_type": model_type, **fields, **_labels(labels)}


_TINY_RESNET = _rtdetr_resnet(16, [16, 32, 48, 64], [1, 1, 1, 1], "basic")
_TINY_RTDETR = {
    "backbone_config": _TINY_RESNET,
    "encoder_in_channels": [32, 48, 64],
    "encoder_hidden_dim": 32,
    "encoder_ffn_dim": 64,
    "encoder_attention_heads": 4,
    "d_model": 32,
    "decoder_in_channels": [32, 32, 32],
    "decoder_ffn_dim": 64,
    "decoder_attention_heads": 4,
    "num_queries": 12,
    "num_denoising": 0,
    "initializer_range": 0.2,
}
_TINY_HGNET = {
    "model_type": "hgnet_v2",
    "stem_channels": [3, 8, 8],
    "stage_in_channels": [8, 16, 32, 48],
    "stage_mid_channels": [8, 8, 16, 16],
    "stage_out_channels": [16, 32, 48, 64],
    "stage_num_blocks": [1, 1, 1, 1],
    "stage_downsample": [False, True, True, True],
    "stage_light_block": [False, False, True, True],
    "stage_kernel_size": [3, 3, 5, 5],
    "stage_numb_of_layers": [1, 1, 1, 1],
    "hidden_sizes": [16, 32, 48, 64],
    "depths": [1, 1, 1, 1],
    "embedding_size": 8,
    "out_features": _RESNET_STAGES,
}
_TINY_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "out_indices": [1, 2]}
_TINY_LW = {
    "d_model": 32,
    "decoder_ffn_dim": 64,
    "decoder_layers": 1,
    "decoder_self_attention_heads": 2,
    "decoder_cross_attention_heads": 2,
    "num_queries": 12,
    "group_detr": 1,
    "c2f_num_blocks": 1,
}
_TINY_DETR = {
    "use_timm_backbone": False,
    "use_pretrained_backbone": False,
    "backbone": None,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_queries": 12,
}
_SMALL_SIDE = {"shortest_edge": 64, "longest_edge": 96}

# name -> (config.json, preprocessor_config.json)
PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "tiny-rtdetr": (
        _config("RTDetrForObjectDetection", "rt_detr", _TINY, decoder_layers=1, **_TINY_RTDETR),
        _processor("RTDetrImageProcessor", {"height": 64, "width": 64}, normalize=False),
    ),
    "tiny-rtdetr-v2": (
        _config("RTDetrV2ForObjectDetection", "rt_detr_v2", _TINY, decoder_layers=2, **_TINY_RTDETR),
        _processor("RTDetrImageProcessor", {"height": 64, "width": 64}, normalize=False),
    ),
    "tiny-dfine": (
        _config(
            "DFineForObjectDetection",
            "d_fine",
            _TINY,
            decoder_layers=2,
            lqe_hidden_dim=16,
            **{**_TINY_RTDETR, "backbone_config": _TINY_HGNET},
        ),
        _processor("RTDetrImageProcessor", {"height": 64, "width": 64}, normalize=False),
    ),
    "tiny-lwdetr": (
        _config(
            "LwDetrForObjectDetection",
            "lw_detr",
            _TINY,
            projector_scale_factors=[1.0],
            backbone_config={
                "model_type": "lw_detr_vit",
                **_TINY_VIT,
                "image_size": 64,
                "pretrain_image_size": 64,
                "patch_size": 16,
                "window_block_indices": [0],
                "num_windows": 4,
            },
            **_TINY_LW,
        ),
        _processor("DeformableDetrImageProcessor", {"height": 64, "width": 64}),
    ),
    "tiny-rfdetr": (
        _config(
            "RfDetrForObjectDetection",
            "rf_detr",
            _TINY,
            backbone_config={
                "model_type": "rf_detr_dinov2",
                **_TINY_VIT,
                "image_size": 56,
                "patch_size": 14,
                "num_windows": 2,
            },
            **_TINY_LW,
        ),
        _processor("RfDetrImageProcessor", {"height": 56, "width": 56}),
    ),
    "tiny-yolos": (
        _config(
            "YolosForObjectDetection",
            "yolos",
            [*_TINY, "N/A"],
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=[64, 96],
            patch_size=16,
            num_detection_tokens=10,
        ),
        _processor("YolosImageProcessor", _SMALL_SIDE),
    ),
    "tiny-conditional-detr": (
        _config(
            "ConditionalDetrForObjectDetection",
            "conditional_detr",
            _TINY,
            backbone_config=_resnet(16, [16, 32, 48, 64], [1, 1, 1, 1], "basic", ["stage4"]),
            **_TINY_DETR,
        ),
        _processor("ConditionalDetrImageProcessor", _SMALL_SIDE),
    ),
    "tiny-deformable-detr": (
        _config(
            "DeformableDetrForObjectDetection",
            "deformable_detr",
            _TINY,
            num_feature_levels=4,
            backbone_config=_resnet(16, [16, 32, 48, 64], [1, 1, 1, 1], "basic", _RESNET_STAGES),
            **_TINY_DETR,
        ),
        _processor("DeformableDetrImageProcessor", {"height": 64, "width": 96}),  # one size: see hf_detectors
    ),
}

_R50 = ([256, 512, 1024, 2048], [3, 4, 6, 3])
# RT-DETR's published initializer_range (0.01) leaves a random 256-wide model's encoder features below
# LayerNorm's eps, so every position scores alike and the query top-k is decided by ties (export parity
# 1.6 at r50vd); 1/sqrt(256) keeps the linear layers at unit gain. Speed does not depend on it.
_UNIT_GAIN = 0.0625
_R50_DETR = {"use_timm_backbone": False, "use_pretrained_backbone": False, "backbone": None}
# Realistic sizes: transformers 5.24's config defaults, which its docstrings give as those of the named
# hub checkpoint, unless a size is written here.
PRESETS.update(
    {
        "rtdetr-r50vd": (  # RTDetrConfig's defaults: PekingU/rtdetr_r50vd (42.9M parameters)
            _config("RTDetrForObjectDetection", "rt_detr", COCO_80, initializer_range=_UNIT_GAIN),
            _processor("RTDetrImageProcessor", {"height": 640, "width": 640}, normalize=False),
        ),
        # RTDetrV2Config's defaults: its docstring names PekingU/rtdetr_r18vd, its default backbone is ResNet-50-vd
        "rtdetr-v2-r50vd": (
            _config("RTDetrV2ForObjectDetection", "rt_detr_v2", COCO_80, initializer_range=_UNIT_GAIN),
            _processor("RTDetrImageProcessor", {"height": 640, "width": 640}, normalize=False),
        ),
        "dfine-xlarge": (  # DFineConfig's defaults: ustc-community/dfine-xlarge-coco
            _config("DFineForObjectDetection", "d_fine", COCO_80, initializer_range=_UNIT_GAIN),
            _processor("RTDetrImageProcessor", {"height": 640, "width": 640}, normalize=False),
        ),
        "lwdetr-small": (  # LwDetrConfig's defaults: AnnaZhang/lwdetr_small_60e_coco, 640 x 640
            _config("LwDetrForObjectDetection", "lw_detr", COCO_91, projector_scale_factors=[1.0]),
            _processor("DeformableDetrImageProcessor", {"height": 640, "width": 640}),
        ),
        "rf-detr-base": (  # RfDetrConfig's defaults: Roboflow/rf-detr-base, 560 x 560
            _config("RfDetrForObjectDetection", "rf_detr", COCO_91),
            _processor("RfDetrImageProcessor", {"height": 560, "width": 560}),
        ),
        "yolos-tiny": (  # hustvl/yolos-tiny: DeiT-Ti sizes, 100 detection tokens, shortest side 512
            _config(
                "YolosForObjectDetection",
                "yolos",
                COCO_91,
                hidden_size=192,
                num_hidden_layers=12,
                num_attention_heads=3,
                intermediate_size=768,
                image_size=[800, 1333],
                num_detection_tokens=100,
                use_mid_position_embeddings=False,
            ),
            _processor("YolosImageProcessor", {"shortest_edge": 512, "longest_edge": 1333}),
        ),
        "conditional-detr-resnet-50": (  # microsoft/conditional-detr-resnet-50 sizes, transformers' ResNet-50
            _config(
                "ConditionalDetrForObjectDetection",
                "conditional_detr",
                COCO_91,
                **_R50_DETR,
                backbone_config=_resnet(64, *_R50, "bottleneck", ["stage4"]),
            ),
            _processor("ConditionalDetrImageProcessor", {"shortest_edge": 800, "longest_edge": 1333}),
        ),
        "deformable-detr": (  # SenseTime/deformable-detr sizes, transformers' ResNet-50
            _config(
                "DeformableDetrForObjectDetection",
                "deformable_detr",
                COCO_91,
                **_R50_DETR,
                backbone_config=_resnet(64, *_R50, "bottleneck", _RESNET_STAGES),
            ),
            _processor("DeformableDetrImageProcessor", {"shortest_edge": 800, "longest_edge": 1333}),  # refused
        ),
    }
)


def jitter_constants(model: Any, seed: int) -> None:
    """Add seeded N(0, 0.02) noise to every parameter whose elements are all equal (zero-initialised heads)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)


# preset -> a step after transformers' initialisation, (model, seed) -> None (export.hf_presets.build)
# (transformers zero-initialises the query-selection score heads: the realistic presets' encoder scores then
# sit within 1e-5 of the prior bias, ~1,000 of 8,400 exactly equal, and the query top-k swaps candidates
# between ORT and PyTorch: export parity 0.25 for rtdetr-r50vd, 1.07 for lwdetr-small without this)
AFTER_INIT: dict[str, Callable[[Any, int], None]] = {
    name: jitter_constants for name in ("tiny-dfine", "dfine-xlarge", "rtdetr-r50vd", "rtdetr-v2-r50vd", "lwdetr-small")
}
hf_presets.PRESETS.update(PRESETS)
hf_presets.AFTER_INIT.update(AFTER_INIT)
