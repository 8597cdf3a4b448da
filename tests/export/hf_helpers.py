"""What the Hugging Face importer suites share: tiny presets imported once, and transformers' own model."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from export.hf import export_hf
from export.hf_presets import build


def import_presets(root: Path, presets: Iterable[str]) -> Path:
    """Build each preset offline into ``root/checkpoints/<preset>`` and import it into
    ``root/repository/<preset>/1``; returns ``root``."""
    for preset in presets:
        build(preset, root / "checkpoints" / preset)
        export_hf(root / "checkpoints" / preset, root / "repository" / preset / "1", opset=18)
    return root


def transformers_model(folder: Path):
    """The checkpoint in ``folder`` as transformers loads it (its ``architectures[0]`` class), in eval mode."""
    import transformers

    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(str(folder), local_files_only=True).eval()
