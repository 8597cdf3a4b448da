"""Export a trained checkpoint into the model repository.

    python -m export checkpoint runs/vit-digits/checkpoint.pt --to model_repository/vit-digits/1

writes ``model.onnx`` and ``model.json`` (the manifest, with the parity measured here and the
test metrics measured through ONNX Runtime with the server's preprocessing), and copies the
run's ``metrics.json`` and ``training_curves.png`` beside them.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from export.checkpoint import export_checkpoint
from export.onnx_export import DEFAULT_OPSET


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    checkpoint = commands.add_parser("checkpoint", help="export a checkpoint written by models/")
    checkpoint.add_argument("checkpoint", type=Path)
    checkpoint.add_argument("--to", type=Path, required=True, help="model_repository/<name>/<version>")
    checkpoint.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.command == "checkpoint":
        manifest = export_checkpoint(args.checkpoint, args.to, opset=args.opset)
        for extra in ("metrics.json", "training_curves.png"):
            if (args.checkpoint.parent / extra).exists():
                shutil.copy(args.checkpoint.parent / extra, args.to / extra)
        print(
            f"wrote {args.to}: {manifest.task}, metrics {manifest.provenance.metrics}, "
            f"parity {manifest.provenance.export.parity_max_abs_diff}"
        )


if __name__ == "__main__":
    main()
