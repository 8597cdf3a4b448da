"""The ViT backbones people fine-tune, imported from transformers: DINOv2 (with registers), Swin, Swinv2, BEiT.

Registers each family's head into ``export.hf.HEADS`` and its random-weight presets into
``export.hf_presets.PRESETS``; ``python -m export hf`` does the rest (dynamo export, parity with
transformers at batch 1 and 4, the manifest). Every graph outputs ``logits`` (B, num_labels),
float32, computed as transformers' head computes them, and ``embedding`` (B, D), float32, the
pooled representation that head takes, after the final LayerNorm (so every import serves
``classify`` and ``embed``):

* ``Dinov2ForImageClassification`` (Oquab et al. 2024, "DINOv2", Sec. 4 and 7: a linear layer on
  the class token concatenated with the average of the patch tokens), ViT-S/B/L/g, with the
  MLP or (ViT-g) the SwiGLU feed-forward: ``embedding`` (B, 2 * hidden) = [class token, mean of
  the patch tokens]; its first half is DINOv2's own class-token embedding (``pooler_output``).
  ``attentions`` (B, depth, 1, T, T), heads fused, one class token before the patch grid.
* ``Dinov2WithRegistersForImageClassification`` (Darcet et al. 2024, "Vision Transformers Need
  Registers", Sec. 2): as DINOv2, the register tokens left out of the patch mean as transformers
  leaves them out; ``attention.prefix_tokens`` = class then each register, so the rollout draws
  the patches only.
* ``SwinForImageClassification`` (Liu et al. 2021, Sec. 3.1) and ``Swinv2ForImageClassification``
  (Liu et al. 2022): ``embedding`` (B, hidden) = the average of the last stage's tokens after the
  final LayerNorm (``pooler_output``, what the linear head takes). No attention output: shifted
  windows attend within 7x7 (Swinv2: 8x8) windows with no class token, so attention rollout has
  no token to roll out to and no matrix over the whole image (the manifest's
  ``no_attention_reason``). Instead ``class_maps`` (B, N, num_labels), the head applied to each
  of the last stage's N tokens (7x7 at 224), whose mean is ``logits``: ``render=png`` draws the
  top class's class activation map (Zhou et al. 2016, "Learning Deep Features for Discriminative
  Localization", CVPR, Sec. 2), exact here because the head is linear on the token mean.
* ``BeitForImageClassification`` (Bao et al. 2022, "BEiT", Sec. 2.6 and 3.1): ``embedding``
  (B, hidden) = the LayerNorm of the mean of the patch tokens (``use_mean_pooling``, as the
  fine-tuned checkpoints are), or the class token after the final LayerNorm when the config
  pools the class token. ``attentions``: one class token before the grid. The rollout reads the
  class token's row (Abnar & Zuidema's definition) although BEiT's head pools the patches.

Refused by name (``REFUSED``): ``DINOv3ViTModel`` (transformers 5.24 ships DINOv3 without a
classification head; an embedding-only import is not written yet) and the bare backbones
(``Dinov2Model``, ``SwinModel``, ...), which have no head to serve.

Preset sources (configs as published on the hub, weights random): facebook/dinov2-small-imagenet1k-1-layer,
facebook/dinov2-base-imagenet1k-1-layer, facebook/dinov2-giant-imagenet1k-1-layer,
facebook/dinov2-with-registers-small-imagenet1k-1-layer, microsoft/swin-tiny-patch4-window7-224,
microsoft/swinv2-tiny-patch4-window8-256, microsoft/beit-base-patch16-224; ``tiny-*`` are the
same architectures at test size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from export.hf import _CLASSIFIER, REFUSED, fused_attentions, register
from export.hf_presets import _IMAGENET, _TINY, IMAGENET_MEAN, IMAGENET_STD, PRESETS, _labels

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_NO_WINDOW_ROLLOUT = (
    "Swin attends within shifted local windows and has no class token, so attention rollout has no "
    "token to roll out and no attention matrix over the whole image"
)


def _dinov2_pool(prefix: int) -> Callable[[Any], torch.Tensor]:
    """DINOv2's head input: [class token, mean of the patch tokens] (B, 2 * hidden), after the final LayerNorm."""

    def pool(outputs: Any) -> torch.Tensor:
        tokens = outputs.last_hidden_state  # (B, prefix + N, hidden), after the final LayerNorm
        return torch.cat([tokens[:, 0], tokens[:, prefix:].mean(dim=1)], dim=1)

    return pool


def _pooler_output(outputs: Any) -> torch.Tensor:
    """Swin's average of the final tokens, BEiT's pooled patches or class token: (B, hidden)."""
    return outputs.pooler_output


class _ClassMaps(nn.Module):
    """(B, 3, H, W) -> (logits (B, L), embedding (B, hidden), class_maps (B, N, L)) for a head linear on a token mean.

    ``class_maps`` is the checkpoint's ``classifier`` applied to each of the N final tokens (after
    the final LayerNorm) before transformers averages them: their mean over N is ``logits``, exactly
    up to float rounding, since the head is linear (Zhou et al. 2016, CVPR, Sec. 2: class activation
    mapping). Swin and Swinv2, whose windowed attention has no rollout, draw it for ``render=png``.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = getattr(model, model.base_model_prefix)
        assert isinstance(model.classifier, nn.Module)  # the checkpoint's linear head
        self.classifier = model.classifier

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = self.backbone(pixel_values=pixel_values)
        embedding = outputs.pooler_output  # (B, hidden): the mean of last_hidden_state's N tokens
        return self.classifier(embedding), embedding, self.classifier(outputs.last_hidden_state)


def _swin_grid(config: dict[str, Any], size: tuple[int, int]) -> tuple[int, int]:
    """The last stage's token grid: the patch grid halved (odd sides padded first) by each patch merging."""
    rows, cols = size[0] // int(config.get("patch_size", 4)), size[1] // int(config.get("patch_size", 4))
    for _ in range(len(config.get("depths", [2, 2, 6, 2])) - 1):
        rows, cols = (rows + 1) // 2, (cols + 1) // 2
    return rows, cols


class _Pooled(nn.Module):
    """(B, 3, H, W) pixel values -> (logits (B, num_labels), embedding (B, D)[, attentions (B, depth, 1, T, T)]).

    ``embedding`` = ``pool`` of the backbone's outputs; ``logits`` = the checkpoint's own linear
    ``classifier`` on it: the computation of transformers' ``*ForImageClassification.forward``,
    written out so the head's input is an output too (the parity with the whole transformers
    model is checked at export and in tests/export/test_hf_backbones.py).
    """

    def __init__(self, model: PreTrainedModel, pool: Callable[[Any], torch.Tensor], attentions: bool) -> None:
        super().__init__()
        self.backbone = getattr(model, model.base_model_prefix)
        assert isinstance(model.classifier, nn.Module)  # the checkpoint's linear head
        self.classifier = model.classifier
        self.pool, self.attentions = pool, attentions

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.backbone(pixel_values=pixel_values, output_attentions=self.attentions)
        embedding = self.pool(outputs)
        if not self.attentions:
            return self.classifier(embedding), embedding
        return self.classifier(embedding), embedding, fused_attentions(outputs.attentions)


def _registers(config: dict[str, Any]) -> int:
    return int(config.get("num_register_tokens", 0))


def _wrap_dinov2(model: PreTrainedModel) -> nn.Module:
    return _Pooled(model, _dinov2_pool(1 + int(getattr(model.config, "num_register_tokens", 0))), attentions=True)


_DINOV2 = replace(
    _CLASSIFIER,
    wrapper=_wrap_dinov2,
    prefix_tokens=lambda config: ["class"] + ["register"] * _registers(config),
    note=lambda config: (
        "logits = linear([class token, mean of the patch tokens]) as transformers computes them"
        + (f", the {_registers(config)} register tokens left out of the mean" if _registers(config) else "")
        + "; embedding = that concatenation (2 x hidden)"
        + ("; SwiGLU feed-forward" if config.get("use_swiglu_ffn") else "")
    ),
)
_SWIN = replace(
    _CLASSIFIER,
    wrapper=_ClassMaps,
    outputs=("logits", "embedding", "class_maps"),
    prefix_tokens=None,
    no_attention_reason=_NO_WINDOW_ROLLOUT,
    class_map_grid=_swin_grid,
    note=lambda config: "embedding = the mean of the last stage's tokens after the final LayerNorm (pooler_output)",
)
_BEIT = replace(
    _CLASSIFIER,
    wrapper=lambda model: _Pooled(model, _pooler_output, attentions=True),
    note=lambda config: (
        "embedding = "
        + (
            "LayerNorm(mean of the patch tokens), BEiT's mean pooling"
            if config.get("use_mean_pooling", True)
            else "the class token after the final LayerNorm"
        )
    ),
)

for _architecture, _head in {
    "Dinov2ForImageClassification": _DINOV2,
    "Dinov2WithRegistersForImageClassification": _DINOV2,
    "SwinForImageClassification": _SWIN,
    "Swinv2ForImageClassification": _SWIN,
    "BeitForImageClassification": _BEIT,
}.items():
    register(_architecture, _head)

_HEADLESS = "a bare backbone without a classification head; import its *ForImageClassification checkpoint"
REFUSED.update(
    {
        "DINOv3ViTModel": "transformers 5.24 ships DINOv3 only as DINOv3ViTModel, without a classification head, "
        "and this importer writes classifiers (with their embeddings); an embedding-only DINOv3 import is not "
        "supported yet",
        **{name: _HEADLESS for name in ("Dinov2Model", "Dinov2WithRegistersModel", "SwinModel", "Swinv2Model")},
        "BeitModel": _HEADLESS,
    }
)


# --- Presets: config.json and preprocessor_config.json as the hub publishes them -------------------------------


def _dinov2(hidden: int, layers: int, heads: int, *, image: int = 518, patch: int = 14, mlp_ratio: float = 4,
            swiglu: bool = False, registers: int = 0, labels: list[str] = _IMAGENET) -> dict[str, Any]:  # fmt: skip
    config = {
        "architectures": ["Dinov2WithRegistersForImageClassification" if registers else "Dinov2ForImageClassification"],
        "model_type": "dinov2_with_registers" if registers else "dinov2",
        "attention_probs_dropout_prob": 0.0,
        "drop_path_rate": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": hidden,
        "image_size": image,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-06,
        "layerscale_value": 1.0,
        "mlp_ratio": mlp_ratio,
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": patch,
        "qkv_bias": True,
        "use_swiglu_ffn": swiglu,
        **_labels(labels),
    }
    return {**config, "num_register_tokens": registers} if registers else config


def _bit_processor(shortest: int, crop: int) -> dict[str, Any]:
    return {  # DINOv2's BitImageProcessor: shortest edge 256, bicubic, centre crop 224, ImageNet statistics
        "crop_size": {"height": crop, "width": crop},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": "BitImageProcessor",
        "image_std": IMAGENET_STD,
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": shortest},
    }


def _swin(v2: bool, embed: int, depths: list[int], heads: list[int], window: int, image: int, patch: int = 4,
          labels: list[str] = _IMAGENET) -> dict[str, Any]:  # fmt: skip
    config = {
        "architectures": ["Swinv2ForImageClassification" if v2 else "SwinForImageClassification"],
        "model_type": "swinv2" if v2 else "swin",
        "attention_probs_dropout_prob": 0.0,
        "depths": depths,
        "drop_path_rate": 0.1,
        "embed_dim": embed,
        "encoder_stride": 32,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "image_size": image,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-05,
        "mlp_ratio": 4.0,
        "num_channels": 3,
        "num_heads": heads,
        "patch_size": patch,
        "qkv_bias": True,
        "use_absolute_embeddings": False,
        "window_size": window,
        **_labels(labels),
    }
    return {**config, "pretrained_window_sizes": [0] * len(depths)} if v2 else {**config, "patch_norm": True}


def _swin_processor(size: int, legacy: bool) -> dict[str, Any]:
    common = {"do_normalize": True, "do_resize": True, "image_mean": IMAGENET_MEAN, "image_std": IMAGENET_STD}
    if legacy:  # microsoft/swin-tiny-patch4-window7-224 predates image processors
        return {**common, "feature_extractor_type": "ViTFeatureExtractor", "resample": 3, "size": size}
    return {
        **common,
        "do_rescale": True,
        "image_processor_type": "ViTImageProcessor",
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": size, "width": size},
    }


def _beit(hidden: int, layers: int, heads: int, mlp: int, image: int, patch: int,
          labels: list[str] = _IMAGENET) -> dict[str, Any]:  # fmt: skip
    return {
        "architectures": ["BeitForImageClassification"],
        "model_type": "beit",
        "attention_probs_dropout_prob": 0.0,
        "drop_path_rate": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": hidden,
        "image_size": image,
        "initializer_range": 0.02,
        "intermediate_size": mlp,
        "layer_norm_eps": 1e-12,
        "layer_scale_init_value": 0.1,
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": patch,
        "use_absolute_position_embeddings": False,
        "use_mask_token": False,
        "use_mean_pooling": True,
        "use_relative_position_bias": True,
        "use_shared_relative_position_bias": False,
        "vocab_size": 8192,
        **_labels(labels),
    }


def _beit_processor(size: int) -> dict[str, Any]:
    return {  # the hub's BEiT config: a legacy feature extractor, bare int size, no centre crop
        "crop_size": size,
        "do_center_crop": False,
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "BeitFeatureExtractor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "reduce_labels": False,
        "resample": 2,
        "size": size,
    }


# name -> (config.json, preprocessor_config.json). The tiny DINOv2s' position embeddings are a 6x6 grid
# interpolated to the 4x4 grid of their 32x32 crop, as the hub's 37x37 (518 px) are to 16x16 (224 px).
BACKBONE_PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dinov2-small-imagenet1k-1-layer": (_dinov2(384, 12, 6), _bit_processor(256, 224)),
    "dinov2-base-imagenet1k-1-layer": (_dinov2(768, 12, 12), _bit_processor(256, 224)),
    "dinov2-giant-imagenet1k-1-layer": (_dinov2(1536, 40, 24, swiglu=True), _bit_processor(256, 224)),
    "dinov2-with-registers-small-imagenet1k-1-layer": (_dinov2(384, 12, 6, registers=4), _bit_processor(256, 224)),
    "swin-tiny-patch4-window7-224": (
        _swin(False, 96, [2, 2, 6, 2], [3, 6, 12, 24], 7, 224),
        _swin_processor(224, True),
    ),
    "swinv2-tiny-patch4-window8-256": (
        _swin(True, 96, [2, 2, 6, 2], [3, 6, 12, 24], 8, 256),
        _swin_processor(256, False),
    ),
    "beit-base-patch16-224": (_beit(768, 12, 12, 3072, 224, 16), _beit_processor(224)),
    "tiny-dinov2": (_dinov2(32, 2, 4, image=48, patch=8, mlp_ratio=2, labels=_TINY), _bit_processor(40, 32)),
    "tiny-dinov2-swiglu": (
        _dinov2(32, 2, 4, image=48, patch=8, mlp_ratio=2, swiglu=True, labels=_TINY),
        _bit_processor(40, 32),
    ),
    "tiny-dinov2-registers": (
        _dinov2(32, 2, 4, image=48, patch=8, mlp_ratio=2, registers=4, labels=_TINY),
        _bit_processor(40, 32),
    ),
    "tiny-swin": (_swin(False, 16, [1, 1], [2, 4], 2, 32, labels=_TINY), _swin_processor(32, True)),
    "tiny-swinv2": (_swin(True, 16, [1, 1], [2, 4], 2, 32, labels=_TINY), _swin_processor(32, False)),
    "tiny-beit": (_beit(32, 2, 4, 64, 32, 8, labels=_TINY), _beit_processor(32)),
}
PRESETS.update(BACKBONE_PRESETS)
