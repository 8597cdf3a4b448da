"""DETR: DEtection TRansformer (Carion et al., "End-to-End Object Detection with Transformers", ECCV 2020).

A CNN backbone's feature map is projected to width d by a 1x1 convolution, flattened, and
encoded by a transformer with a 2-D sine position encoding added in every attention layer;
N learned object queries are decoded in parallel against it; each decoded query goes through
a linear class head (num_classes + 1 outputs, the last being "no object") and a 3-layer MLP
box head whose sigmoid gives a (cx, cy, w, h) box normalised to the input. Trained with the
Hungarian set loss (:mod:`models.matcher`, :mod:`models.losses`), so inference needs no
anchors and no non-maximum suppression.

Two training variants, both one-to-one at inference (no NMS):

* ``class_head="sigmoid"``: the class head has ``num_classes`` outputs and no "no object"
  class, each an independent sigmoid trained with the focal loss (Lin et al. 2017, as
  Deformable DETR does: Zhu et al. 2021, Sec. 4.1 and appendix A.2); its bias starts at
  ``-log((1 - 0.01) / 0.01)`` (Lin et al. 2017, Sec. 4.1, "Initialization").
* ``num_groups=K`` (Group DETR, Chen et al. 2023, Sec. 3.2): K groups of ``num_queries``
  queries in training, each matched one-to-one to the targets on its own, the decoder's
  self-attention kept within a group; in eval mode, and after :func:`for_inference`, only
  group 0 is decoded, so outputs and the exported graph keep ``num_queries`` queries.
* ``dn_groups=P`` (DN-DETR, Li et al. 2022): given the targets in training, P groups of noised
  ground-truth queries are decoded beside the matching ones (:mod:`models.denoising`) and
  returned apart, under ``"dn"``; without targets, in eval mode and after
  :func:`for_inference`, there are none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from models.backbone import build_backbone
from models.position_encoding import build_position_encoding
from models.transformer import Transformer


@dataclass(frozen=True)
class DETRConfig:
    """Hyper-parameters of a DETR (the paper's names in brackets).

    Attributes:
        num_classes: object classes, without "no object"; the class head has one more output.
        num_queries: object queries N, the most objects one image can get [N].
        hidden_size: transformer width d.
        num_heads: attention heads.
        num_encoder_layers, num_decoder_layers: depths.
        ffn_size: feed-forward width.
        dropout: transformer dropout (0 at inference).
        normalize_before: pre-norm transformer layers (False: the paper's post-norm).
        backbone: "resnet50" or "conv" (:mod:`models.backbone`).
        backbone_channels, backbone_strides: the "conv" backbone's layers.
        in_channels: 1 (grayscale) or 3 (RGB).
        image_size: (height, width) the model is trained and exported at, in pixels.
        aux_loss: return every decoder layer's predictions for the auxiliary losses.
        class_head: "softmax" (DETR: num_classes + 1 outputs, "no object" last) or
            "sigmoid" (Deformable DETR's focal form: num_classes outputs, no "no object").
        num_groups: Group DETR's query groups in training (1: plain DETR).
        dn_groups, dn_label_noise, dn_box_noise: DN-DETR's denoising groups in training (0:
            none), label flip probability and box noise scale (0.2 and 0.4 in the paper).
        fixed_frame: 0: DETR's positions, normalised by each image's valid extent. F > 0: the
            transformer works in a fixed frame of F x F input pixels (its position encoding is
            normalised by F, and the box head predicts in units of F), and the boxes are then
            divided by the image's valid extent measured from ``pixel_mask``, so the outputs
            keep DETR's convention. Where images differ in size, the network then need not
            infer each image's extent to turn what it sees in pixels into normalised boxes.
    """

    num_classes: int = 91
    num_queries: int = 100
    hidden_size: int = 256
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    ffn_size: int = 2048
    dropout: float = 0.1
    normalize_before: bool = False
    backbone: Literal["resnet50", "conv"] = "resnet50"
    backbone_channels: tuple[int, ...] = ()
    backbone_strides: tuple[int, ...] = ()
    in_channels: int = 3
    image_size: tuple[int, int] = (800, 800)
    aux_loss: bool = True
    class_head: Literal["softmax", "sigmoid"] = "softmax"
    num_groups: int = 1
    dn_groups: int = 0
    dn_label_noise: float = 0.2
    dn_box_noise: float = 0.4
    fixed_frame: int = 0


FOCAL_PRIOR = 0.01  # Lin et al. 2017, Sec. 4.1: every class starts at probability ~0.01


CONFIGS: dict[str, DETRConfig] = {
    # The small pre-norm DETR trained here on the synthetic digits: six 3x3 convolutions down
    # to an 8x8 map of a 128x128 input, d = 128, 3 + 3 layers, 25 queries.
    "digits-small": DETRConfig(
        num_classes=10,
        num_queries=25,
        hidden_size=128,
        num_heads=8,
        num_encoder_layers=3,
        num_decoder_layers=3,
        ffn_size=512,
        dropout=0.0,
        normalize_before=True,
        backbone="conv",
        backbone_channels=(32, 64, 64, 128, 128, 128),
        backbone_strides=(2, 2, 1, 2, 1, 2),
        in_channels=1,
        image_size=(128, 128),
    ),
    # The paper's DETR-R50 (Table 1): ResNet-50, d = 256, 6 + 6 layers, 8 heads, FFN 2048,
    # 100 queries, COCO's 91 category ids; 41.3M parameters in the paper.
    "detr-r50": DETRConfig(),
}


class MLP(nn.Module):
    """``num_layers`` linear layers with ReLU between them (DETR's box head: 3 layers)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip(dims, [*dims[1:], output_dim], strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < len(self.layers) - 1 else layer(x)
        return x


class DETR(nn.Module):
    """Backbone + transformer + prediction heads.

    ``forward(images, pixel_mask=None)`` takes float32 (B, C, H, W) and, for a batch padded
    to one size, ``pixel_mask`` (B, H, W), 1 on real pixels and 0 on padding (the Hugging Face
    processor's convention; padding at the bottom and right), and returns a dict:

    * ``pred_logits``: (B, num_queries, num_classes + 1) raw class scores, the last column
      "no object" (``class_head="sigmoid"``: (B, num_queries, num_classes), no "no object");
    * ``pred_boxes``: (B, num_queries, 4) boxes (cx, cy, w, h) in [0, 1], relative to the
      input's width and height;
    * ``aux_outputs`` (only with ``aux_loss``): the same two for every decoder layer but the
      last, a list of dicts, for the auxiliary losses.

    The mask is downsampled to the feature map (nearest, as DETR's ``NestedTensor``); the
    position encoding is normalised by each image's valid extent and no attention reads a
    padded position (Carion et al. 2020, Sec. 4). With ``fixed_frame`` F the encoding and the
    box head's raw output are in units of F pixels instead, and the boxes are converted to
    the image's valid extent (its rows and columns holding a 1 in ``pixel_mask``; the whole
    input without one) in the graph. The transformer then cannot tell how much
    padding an image got, so with a mask the boxes are relative to the unpadded image, as in
    DETR's own training (targets normalised before batch padding; Massa in facebookresearch/detr
    issue 286); without a mask, relative to the whole input (a letterboxed input's padding
    included).

    In training mode with ``num_groups = K > 1`` the outputs hold K * num_queries queries, group
    k at ``[k * num_queries, (k + 1) * num_queries)``; in eval mode only group 0's.
    """

    def __init__(self, config: DETRConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.backbone = build_backbone(
            config.backbone, config.in_channels, config.backbone_channels, config.backbone_strides
        )
        self.position_encoding = build_position_encoding(d)
        self.input_proj = nn.Conv2d(self.backbone.num_channels, d, kernel_size=1)
        self.transformer = Transformer(
            hidden_size=d,
            num_heads=config.num_heads,
            num_encoder_layers=config.num_encoder_layers,
            num_decoder_layers=config.num_decoder_layers,
            ffn_size=config.ffn_size,
            dropout=config.dropout,
            normalize_before=config.normalize_before,
        )
        if 0 < config.fixed_frame < max(config.image_size):
            raise ValueError(
                f"fixed_frame {config.fixed_frame} is smaller than the input ({config.image_size}): "
                "boxes could not reach an image's far edge"
            )
        if config.num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {config.num_groups}")
        self.query_embed = nn.Embedding(config.num_queries * config.num_groups, d)
        no_object = config.class_head == "softmax"
        self.class_embed = nn.Linear(d, config.num_classes + no_object)
        if not no_object:
            nn.init.constant_(self.class_embed.bias, -math.log((1 - FOCAL_PRIOR) / FOCAL_PRIOR))
        self.bbox_embed = MLP(d, d, 4, 3)
        if config.dn_groups:  # DN-DETR: a noised label's content, a noised box's position
            self.dn_label_embed = nn.Embedding(config.num_classes + 1, d)  # + 1: padding slots
            self.dn_box_embed = MLP(4, d, d, 2)

    def queries(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The object queries decoded now and their self-attention mask.

        Returns:
            (Q, d) query embeddings, Q = num_groups * num_queries in training and num_queries
            in eval mode, and a bool (Q, Q) mask, True within a group (None with one group).
        """
        n, groups = self.config.num_queries, self.config.num_groups if self.training else 1
        queries = self.query_embed.weight[: n * groups]  # (Q, d)
        if groups == 1:
            return queries, None
        group = torch.arange(n * groups, device=queries.device) // n  # (Q,) each query's group
        return queries, group[:, None] == group[None, :]  # (Q, Q) block diagonal

    def forward(
        self,
        images: torch.Tensor,
        pixel_mask: torch.Tensor | None = None,
        targets: list[dict[str, torch.Tensor]] | None = None,
    ) -> dict[str, Any]:
        features = self.backbone(images)  # (B, C_backbone, H', W')
        src = self.input_proj(features)  # (B, d, H', W')
        mask = None
        if pixel_mask is not None:
            valid = F.interpolate(pixel_mask[:, None].to(src.dtype), size=src.shape[-2:], mode="nearest")[:, 0]
            mask = valid < 0.5  # (B, H', W') True on padding
        frame = self._frame(images, pixel_mask)  # (B, 4) extent / frame, or None
        extent = None
        if frame is not None:  # the frame in cells of the map: F / stride, for every image
            extent = torch.full((src.shape[0], 2), self.config.fixed_frame / self.backbone.stride, device=src.device)
        pos = self.position_encoding(src, mask, extent).to(src.dtype)  # (B, d, H', W')
        queries, query_mask = self.queries()  # (Q, d), (Q, Q) or None
        tgt, dn = None, None
        if self.training and self.config.dn_groups and targets is not None:
            queries, query_mask, tgt, dn = self._with_denoising(queries, query_mask, targets, src.shape[0], frame)
        hs = self.transformer(src, queries, pos, mask, query_mask, tgt)  # (L, B, Q [+ P M], d)
        logits = self.class_embed(hs)  # (L, B, Q, num_classes + 1), or num_classes for "sigmoid"
        boxes = self.bbox_embed(hs).sigmoid()  # (L, B, Q, 4) normalised cxcywh (of the frame, with one)
        if frame is not None:
            boxes = boxes / frame[None, :, None, :]  # relative to each image's valid extent
        if dn is not None:  # the denoising queries come after the matching ones
            q = logits.shape[2] - dn["labels"].shape[1]
            dn.update(self._outputs(logits[:, :, q:], boxes[:, :, q:]))
            logits, boxes = logits[:, :, :q], boxes[:, :, :q]
        out = self._outputs(logits, boxes)
        if dn is not None:
            out["dn"] = dn
        return out

    def _frame(self, images: torch.Tensor, pixel_mask: torch.Tensor | None) -> torch.Tensor | None:
        """With ``fixed_frame`` F: float (B, 4), each image's valid (w, h, w, h) over F, the
        factor from a box relative to the image to one in units of the frame; None without."""
        if not self.config.fixed_frame:
            return None
        valid = torch.ones_like(images[:, 0], dtype=torch.bool) if pixel_mask is None else pixel_mask > 0
        height = valid.any(dim=2).sum(dim=1).to(torch.float32)  # rows holding a real pixel
        width = valid.any(dim=1).sum(dim=1).to(torch.float32)
        size = torch.stack([width, height, width, height], dim=1)
        return size / self.config.fixed_frame

    def _outputs(self, logits: torch.Tensor, boxes: torch.Tensor) -> dict[str, Any]:
        """Per-layer logits and boxes (L, B, Q, .) -> the last layer's, and the others as ``aux_outputs``."""
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.config.aux_loss:
            out["aux_outputs"] = [
                {"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1], strict=True)
            ]
        return out

    def _with_denoising(
        self,
        queries: torch.Tensor,
        query_mask: torch.Tensor | None,
        targets: list,
        batch: int,
        frame: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The matching queries with DN-DETR's denoising queries appended: positions (B, Q + P M, d),
        the attention mask, the initial content (zeros for the matching ones) and the denoising meta.
        ``frame``: as :meth:`_frame`'s; the noised boxes are then given to the network in the frame's units."""
        from models.denoising import attention_mask, noised_queries

        c = self.config
        dn = noised_queries(targets, c.dn_groups, c.num_classes, label_noise=c.dn_label_noise, box_noise=c.dn_box_noise)
        noised = dn["boxes"] if frame is None else dn["boxes"] * frame[:, None, :]
        positions = self.dn_box_embed(noised)  # (B, P M, d)
        content = self.dn_label_embed(dn["labels"])  # (B, P M, d)
        n = queries.shape[0]
        matching = query_mask if query_mask is not None else torch.ones(n, n, dtype=torch.bool, device=queries.device)
        mask = attention_mask(matching, c.dn_groups, int(dn["group_size"]))
        positions = torch.cat([queries.unsqueeze(0).expand(batch, -1, -1), positions], dim=1)
        content = torch.cat([content.new_zeros(batch, n, queries.shape[1]), content], dim=1)
        return positions, mask, content, dn


class DETRForExport(nn.Module):
    """The graph the server runs: images (B, C, H, W) -> (pred_logits, pred_boxes), no auxiliary outputs.

    With ``mask``, a second input ``pixel_mask`` (B, H, W) as :class:`DETR`'s.
    """

    def __init__(self, model: DETR, mask: bool = False) -> None:
        super().__init__()
        self.model = model
        self.mask = mask

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(images, pixel_mask if self.mask else None)
        return out["pred_logits"], out["pred_boxes"]


def for_inference(model: DETR) -> DETR:
    """A copy of ``model`` with only what inference uses: group 0's queries, no denoising embeddings.

    Its outputs equal ``model``'s in eval mode; the exported graph is the plain DETR's.
    """
    config = replace(model.config, num_groups=1, dn_groups=0)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("dn_")}  # training-only
    state["query_embed.weight"] = state["query_embed.weight"][: config.num_queries].clone()
    inference = DETR(config)
    inference.load_state_dict(state)
    return inference.eval()


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (frozen batch-norm statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def config_dict(config: DETRConfig) -> dict[str, Any]:
    """The config as plain JSON-able values (for checkpoints)."""
    return asdict(config)


def config_from_dict(values: dict[str, Any]) -> DETRConfig:
    """Inverse of :func:`config_dict` (lists back to tuples)."""
    fields_: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return DETRConfig(**fields_)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["num_queries=50", "num_decoder_layers=6"]`` -> typed :class:`DETRConfig` overrides.

    Values take the type of the field's default (int, float, bool, str; tuples as
    comma-separated ints).

    Raises:
        ValueError: an item without ``=`` or a field DETRConfig does not have.
    """
    defaults: dict[str, Any] = {f.name: f.default for f in fields(DETRConfig)}
    overrides: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in defaults:
            raise ValueError(f"expected FIELD=VALUE with a DETRConfig field ({sorted(defaults)}), got {item!r}")
        default = defaults[name]
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name} takes true or false, got {text!r}")
            overrides[name] = text.lower() in ("true", "1")
        elif isinstance(default, tuple):
            overrides[name] = tuple(int(v) for v in text.split(",") if v)
        else:
            overrides[name] = type(default)(text)
    return overrides


def build(name: str, **overrides: Any) -> DETR:
    """A DETR from a named config (``CONFIGS``) with fields overridden, e.g. ``num_classes=10``.

    Raises:
        ValueError: an unknown config name.
    """
    if name not in CONFIGS:
        raise ValueError(f"unknown DETR config {name!r}; known: {sorted(CONFIGS)}")
    return DETR(replace(CONFIGS[name], **overrides))
