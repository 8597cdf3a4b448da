"""Export a trained checkpoint into the model repository.

    python -m export checkpoint runs/vit-digits/checkpoint.pt --to model_repository/vit-digits/1

writes ``model.onnx`` and ``model.json`` (the manifest, with the parity measured here and the
test metrics measured through ONNX Runtime with the server's preprocessing), and copies the
run's ``metrics.json`` and ``training_curves.png`` beside them.

    python -m export hf path/to/transformers-checkpoint --to model_repository/vit-base/1

imports a Hugging Face transformers ``save_pretrained`` folder (ViT, DeiT, DINOv2 with or without
registers, Swin, Swinv2, BEiT, DETR without timm; needs the ``hf`` extra), with preprocessing and
labels from the checkpoint's own configs (docs/backbones.md).

    python -m export random vit-ti16 --to bench/.work/model_repository/vit-ti16-random/1

exports a named ViT config with random weights (for benchmarks only; never committed).

    python -m export fp16 model_repository/vit-digits/1 --to runs/vit-digits-fp16/1 --digits-test

writes a float16 copy of an exported model and measures its top-1 agreement with float32 on
the CPU (``export/fp16.py``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

OPSET_HELP = "ONNX opset (default: export.onnx_export.DEFAULT_OPSET)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    checkpoint = commands.add_parser("checkpoint", help="export a checkpoint written by models/")
    checkpoint.add_argument("checkpoint", type=Path)
    checkpoint.add_argument("--to", type=Path, required=True, help="model_repository/<name>/<version>")
    checkpoint.add_argument("--opset", type=int, help=OPSET_HELP)
    checkpoint.add_argument(
        "--no-attention", action="store_true", help="a ViT without its attention output (no ?render=png)"
    )
    hf = commands.add_parser("hf", help="import a Hugging Face transformers checkpoint folder (save_pretrained)")
    hf.add_argument("folder", type=Path, help="holds config.json, preprocessor_config.json and the weights")
    hf.add_argument("--to", type=Path, required=True, help="model_repository/<name>/<version>")
    hf.add_argument("--opset", type=int, help=OPSET_HELP)
    random = commands.add_parser(
        "random", help="export a named ViT config, or detr-r50, with random weights (benchmarks only)"
    )
    random.add_argument("config", help="a models.vit config name, e.g. vit-ti16, vit-b16; or detr-r50")
    random.add_argument("--to", type=Path, required=True, help="<repository>/<name>/<version>")
    random.add_argument("--num-classes", type=int, default=1000)
    random.add_argument("--seed", type=int, default=0)
    random.add_argument("--opset", type=int, help=OPSET_HELP)
    half = commands.add_parser("fp16", help="a float16 copy of an exported model, top-1 agreement measured on CPU")
    half.add_argument("model", type=Path, help="<repository>/<name>/<version> to convert")
    half.add_argument("--to", type=Path, required=True, help="where to write the float16 model version")
    half.add_argument("--images", type=Path, nargs="*", default=[], help="images, folders or .zip to measure on")
    half.add_argument("--limit", type=int, default=1000, help="most images measured from --images")
    half.add_argument("--digits-test", action="store_true", help="measure on the digits test split (360 images)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # torch only for the commands that export from PyTorch: fp16 runs where torch is not installed
    if args.command != "fp16" and args.opset is None:
        from export.onnx_export import DEFAULT_OPSET

        args.opset = DEFAULT_OPSET

    if args.command == "checkpoint":
        from export.checkpoint import export_checkpoint

        manifest = export_checkpoint(args.checkpoint, args.to, opset=args.opset, attention=not args.no_attention)
        for extra in ("metrics.json", "training_curves.png"):
            if (args.checkpoint.parent / extra).exists():
                shutil.copy(args.checkpoint.parent / extra, args.to / extra)
        print(
            f"wrote {args.to}: {manifest.task}, metrics {manifest.provenance.metrics}, "
            f"parity {manifest.provenance.export.parity_max_abs_diff}"
        )
    elif args.command == "hf":
        from export.hf import ImportRefused, export_hf

        try:
            manifest = export_hf(args.folder, args.to, opset=args.opset)
        except ImportRefused as exc:
            parser.exit(2, f"python -m export hf: {exc}\n")
        print(
            f"wrote {args.to}: {manifest.task}, {manifest.provenance.notes.split(';')[0]}, "
            f"input {manifest.input.shape}, {len(manifest.labels)} labels, "
            f"parity max |ORT - transformers| by batch size {manifest.provenance.export.parity_max_abs_diff}"
        )
    elif args.command == "random":
        from export.random_weights import export_random

        manifest = export_random(args.config, args.to, num_classes=args.num_classes, seed=args.seed, opset=args.opset)
        print(f"wrote {args.to}: {manifest.description}; parity {manifest.provenance.export.parity_max_abs_diff}")
    elif args.command == "fp16":
        from export import fp16

        if args.digits_test:
            inputs, data = fp16.digits_test_inputs(args.model), "the scikit-learn digits test split"
        elif args.images:
            payloads = fp16.image_files(args.images, args.limit)
            inputs, data = fp16.preprocess_all(args.model, payloads), ", ".join(map(str, args.images))
        else:
            parser.error("fp16 needs --images or --digits-test to measure the agreement on")
        agreement = fp16.export_fp16(args.model, args.to, inputs, data=data)
        print(f"wrote {args.to}: top-1 agreement with float32 on {len(inputs)} images: {agreement:.4f}")


if __name__ == "__main__":
    main()
