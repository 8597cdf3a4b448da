"""ONNX Runtime sessions: which execution provider was asked for, which one was really got.

onnxruntime-gpu falls back to the CPU silently when CUDA cannot be loaded, so the provider
in use is always read back from ``session.get_providers()`` and reported, never assumed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class ProviderChoice:
    """What a session got. ``ok`` is False when ``device="cuda"`` did not get CUDA."""

    requested: list[str]
    in_use: list[str]
    ok: bool
    reason: str = ""

    @property
    def primary(self) -> str:
        """The provider that runs the graph ("CUDAExecutionProvider" or "CPUExecutionProvider")."""
        return self.in_use[0] if self.in_use else "none"


def requested_providers(device: Literal["auto", "cuda", "cpu"]) -> list[str]:
    """The providers to ask ONNX Runtime for, in priority order."""
    if device == "cpu":
        return [CPU]
    if device == "cuda" or CUDA in ort.get_available_providers():
        return [CUDA, CPU]
    return [CPU]


class OrtRunner:
    """One ONNX Runtime inference session (one model instance).

    ``run`` is blocking and thread-safe in ONNX Runtime; the batcher calls it from a thread of
    its own (ORT releases the GIL while it computes).
    """

    def __init__(
        self,
        path: Path,
        *,
        device: Literal["auto", "cuda", "cpu"],
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        requested = requested_providers(device)
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=requested)
        in_use = self.session.get_providers()
        if device == "cuda" and CUDA not in in_use:
            choice = ProviderChoice(
                requested,
                in_use,
                ok=False,
                reason=f"device=cuda but the session got {in_use}: CUDA is not usable here "
                f"(onnxruntime-gpu installed? CUDA and cuDNN libraries found? a GPU visible?)",
            )
        else:
            choice = ProviderChoice(requested, in_use, ok=True)
        self.providers = choice
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [output.name for output in self.session.get_outputs()]
        log.info("loaded %s: providers requested %s, in use %s", path, requested, in_use)

    def run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Run the graph on one batch.

        Args:
            batch: float32 array (B, C, H, W).

        Returns:
            Each output by name, with the batch axis first (B, ...).
        """
        outputs = self.session.run(self.output_names, {self.input_name: batch})
        return dict(zip(self.output_names, outputs, strict=True))
