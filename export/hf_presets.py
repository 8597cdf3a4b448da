"""Random-weight transformers checkpoints, built offline from published configs.

    python -m export.hf_presets vit-base-patch16-224 --out runs/hf/vit-base-patch16-224

writes a ``save_pretrained`` folder whose ``config.json`` and ``preprocessor_config.json``
follow those of the hub checkpoint of that name (architecture sizes, preprocessing, the older
key forms the hub still serves) and whose weights are random (seeded). Nothing is
downloaded: no model hub can be reached here, so the import (``python -m export hf``) and its
parity are proven on these. The ``tiny-*`` presets are small versions of the same
architectures for tests.

Sources of the configs: google/vit-base-patch16-224, facebook/deit-base-distilled-patch16-224
and facebook/detr-resnet-50 (revision ``no_timm``, transformers' ResNet-50 backbone). ImageNet
class names are not shipped with any package here, so the ViT/DeiT presets use ``LABEL_<i>``;
DETR's are COCO's 91 category ids with "N/A" at the unused ones, as the hub's config has them.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

COCO_91 = (  # noqa: SIM905 (91 names read better as one string)
    "N/A,person,bicycle,car,motorcycle,airplane,bus,train,truck,boat,traffic light,fire hydrant,N/A,stop sign,"
    "parking meter,bench,bird,cat,dog,horse,sheep,cow,elephant,bear,zebra,giraffe,N/A,backpack,umbrella,N/A,N/A,"
    "handbag,tie,suitcase,frisbee,skis,snowboard,sports ball,kite,baseball bat,baseball glove,skateboard,"
    "surfboard,tennis racket,bottle,N/A,wine glass,cup,fork,knife,spoon,bowl,banana,apple,sandwich,orange,"
    "broccoli,carrot,hot dog,pizza,donut,cake,chair,couch,potted plant,bed,N/A,dining table,N/A,N/A,toilet,N/A,"
    "tv,laptop,mouse,remote,keyboard,cell phone,microwave,oven,toaster,sink,refrigerator,N/A,book,clock,vase,"
    "scissors,teddy bear,hair drier,toothbrush"
).split(",")


def _labels(names: list[str]) -> dict[str, Any]:
    return {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},  # duplicate names (N/A) keep the last id, as on the hub
    }


def _vit(architecture: str, model_type: str, hidden: int, layers: int, heads: int, mlp: int, image: int, patch: int,
         labels: list[str]) -> dict[str, Any]:  # fmt: skip
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "attention_probs_dropout_prob": 0.0,
        "encoder_stride": patch,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": hidden,
        "image_size": image,
        "initializer_range": 0.02,
        "intermediate_size": mlp,
        "layer_norm_eps": 1e-12,
        "num_attention_heads": heads,
        "num_channels": 3,
        "num_hidden_layers": layers,
        "patch_size": patch,
        "qkv_bias": True,
        **_labels(labels),
    }


def _resnet(layer_type: str, embedding: int, hidden: list[int], depths: list[int]) -> dict[str, Any]:
    return {
        "model_type": "resnet",
        "layer_type": layer_type,
        "embedding_size": embedding,
        "hidden_sizes": hidden,
        "depths": depths,
        "hidden_act": "relu",
        "downsample_in_first_stage": False,
        "num_channels": 3,
        "out_features": ["stage1", "stage2", "stage3", "stage4"],
        "out_indices": [1, 2, 3, 4],
    }


def _detr(backbone: dict[str, Any], d_model: int, layers: int, heads: int, ffn: int, queries: int,
          labels: list[str]) -> dict[str, Any]:  # fmt: skip
    return {
        "architectures": ["DetrForObjectDetection"],
        "model_type": "detr",
        "activation_dropout": 0.0,
        "activation_function": "relu",
        "attention_dropout": 0.0,
        "auxiliary_loss": False,
        "backbone": None,
        "backbone_config": backbone,
        "backbone_kwargs": None,
        "use_pretrained_backbone": False,
        "use_timm_backbone": False,
        "d_model": d_model,
        "decoder_attention_heads": heads,
        "decoder_ffn_dim": ffn,
        "decoder_layerdrop": 0.0,
        "decoder_layers": layers,
        "dilation": False,
        "dropout": 0.1,
        "encoder_attention_heads": heads,
        "encoder_ffn_dim": ffn,
        "encoder_layerdrop": 0.0,
        "encoder_layers": layers,
        "init_std": 0.02,
        "init_xavier_std": 1.0,
        "is_encoder_decoder": True,
        "num_channels": 3,
        "num_queries": queries,
        "position_embedding_type": "sine",
        **_labels(labels),
    }


def _vit_processor(size: int, resample: int = 2) -> dict[str, Any]:
    return {
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "ViTImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "resample": resample,
        "rescale_factor": 0.00392156862745098,
        "size": {"height": size, "width": size},
    }


def _deit_processor(size: int, crop: int) -> dict[str, Any]:
    # The hub's DeiT configs predate image processors: feature_extractor_type and a bare int size.
    return {
        "crop_size": crop,
        "do_center_crop": True,
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "DeiTFeatureExtractor",
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
        "resample": 3,
        "size": size,
    }


def _detr_processor(shortest: int, longest: int) -> dict[str, Any]:
    return {
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "format": "coco_detection",
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": "DetrImageProcessor",
        "image_std": IMAGENET_STD,
        "resample": 2,
        "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": shortest, "longest_edge": longest},
    }


_IMAGENET = [f"LABEL_{i}" for i in range(1000)]
_TINY = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# name -> (config.json, preprocessor_config.json)
PRESETS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "vit-base-patch16-224": (
        _vit("ViTForImageClassification", "vit", 768, 12, 12, 3072, 224, 16, _IMAGENET),
        _vit_processor(224),
    ),
    "deit-base-distilled-patch16-224": (
        _vit("DeiTForImageClassificationWithTeacher", "deit", 768, 12, 12, 3072, 224, 16, _IMAGENET),
        _deit_processor(256, 224),
    ),
    "detr-resnet-50": (
        _detr(_resnet("bottleneck", 64, [256, 512, 1024, 2048], [3, 4, 6, 3]), 256, 6, 8, 2048, 100, COCO_91),
        _detr_processor(800, 1333),
    ),
    "tiny-vit": (_vit("ViTForImageClassification", "vit", 32, 2, 4, 64, 32, 8, _TINY), _vit_processor(32)),
    "tiny-deit": (_vit("DeiTForImageClassification", "deit", 32, 2, 4, 64, 32, 8, _TINY), _deit_processor(40, 32)),
    "tiny-deit-distilled": (
        _vit("DeiTForImageClassificationWithTeacher", "deit", 32, 2, 4, 64, 32, 8, _TINY),
        _deit_processor(40, 32),
    ),
    "tiny-detr": (
        _detr(_resnet("basic", 16, [16, 32, 48, 64], [1, 1, 1, 1]), 32, 1, 4, 64, 12, ["cat", "dog", "cup", "N/A"]),
        _detr_processor(96, 160),
    ),
}

# preset -> a step after transformers' initialisation, (model, seed) -> None (the DETR family's, in
# export.hf_detector_presets, which adds its presets to PRESETS and its steps here)
AFTER_INIT: dict[str, Callable[[Any, int], None]] = {}


def build(name: str, out: Path, *, seed: int = 0) -> Path:
    """Write the random-weight checkpoint ``name`` to ``out`` (a ``save_pretrained`` folder).

    The weights are transformers' own initialisation under ``torch.manual_seed(seed)``; the two
    JSON files are then written as the hub has them, so importing reads the hub's key forms.

    Returns:
        ``out``.
    """
    import torch
    import transformers

    config_dict, processor = copy.deepcopy(PRESETS[name])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_dict, indent=2))
    config = transformers.AutoConfig.from_pretrained(str(out), local_files_only=True)
    torch.manual_seed(seed)
    model = getattr(transformers, config_dict["architectures"][0])(config).eval()
    if name in AFTER_INIT:  # a preset whose random initialisation needs one more step (export.hf_detector_presets)
        AFTER_INIT[name](model, seed)
    model.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps({"_name_or_path": f"random-weight {name}", **config_dict}, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m export.hf_presets", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {build(args.name, args.out, seed=args.seed)}")


# The backbone families' presets (DINOv2, Swin, Swinv2, BEiT) and the DETR family's join PRESETS
# from their own modules.
from export import hf_backbones, hf_detector_presets  # noqa: E402, F401

if __name__ == "__main__":
    from export.hf_presets import main as registered_main  # this module as imported, with every family's presets

    registered_main()
