"""ONNX Runtime sessions: which execution provider was asked for, which one was really got.

onnxruntime-gpu falls back to the CPU silently when CUDA cannot be loaded, so the provider
in use is always read back from ``session.get_providers()`` and reported, never assumed.

Threads (onnxruntime.ai, "Thread management"): ``intra_op_threads`` parallelise one run, the
calling thread counted (0: ORT's default, one per physical core of the machine, which ignores
affinity masks and cgroup quotas: :mod:`service.runtime.cpus` chooses the count the server passes).
With spinning on (``session.intra_op.allow_spinning``, ORT's default) the pool's threads
busy-wait between the parallel sections of a run instead of sleeping, so the next section
starts sooner; ``session.force_spinning_stop`` (ORT's session config keys) is set with it, so
the spinning stops as soon as the session's last concurrent run returns and the cores go to
decoding until the next run. ORT has no per-run spinning switch (RunOptions' config keys hold
none), so this session-level pair is how "spin only while a run is running" is had.

IO binding (``io_binding=True``) binds the batch and the outputs to device memory explicitly,
ORT's documented way to control copies on a GPU; it also runs, and is tested, on the CPU
provider.

onnxruntime-gpu installed from PyPI finds the CUDA and cuDNN libraries of the ``nvidia-*``
wheels (what torch ships with) only when they are loaded first: ``onnxruntime.preload_dlls()``
does that (a no-op on the CPU package), once, before the first session that asks for CUDA.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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


@functools.cache
def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the installed ``nvidia-*`` wheels, once (onnxruntime >= 1.21).

    Without it, a server that never imports torch gets no CUDA provider from a pip-installed
    onnxruntime-gpu on a machine whose CUDA libraries come as wheels. Failures are logged, not
    raised: the session then reports the provider it really got.
    """
    if not hasattr(ort, "preload_dlls"):
        return
    try:
        ort.preload_dlls()
    except OSError as exc:
        log.warning("onnxruntime.preload_dlls() failed: %s", exc)


def requested_providers(device: Literal["auto", "cuda", "cpu"]) -> list[str]:
    """The providers to ask ONNX Runtime for, in priority order."""
    if device == "cpu":
        return [CPU]
    if device == "cuda" or CUDA in ort.get_available_providers():
        return [CUDA, CPU]
    return [CPU]


@dataclass(frozen=True)
class CudaOptions:
    """The CUDA execution provider's options (onnxruntime.ai, "CUDA Execution Provider").

    Attributes:
        device_id: the GPU to run on.
        cudnn_conv_algo_search: "EXHAUSTIVE" benchmarks every cuDNN algorithm once per input
            shape (best for fixed shapes), "HEURISTIC" picks one at once (for models such as
            DETR that see many image sizes), "DEFAULT" takes cuDNN's default.
        gpu_mem_limit: bytes the session's memory arena may hold (0: no limit).
        arena_extend_strategy: "kSameAsRequested" grows the arena by what is asked (less
            waste with varying shapes); "kNextPowerOfTwo" is ORT's default.
    """

    device_id: int = 0
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "EXHAUSTIVE"
    gpu_mem_limit: int = 0
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = "kSameAsRequested"

    def provider_options(self) -> dict[str, str]:
        """The options as ONNX Runtime takes them (strings)."""
        options = {
            "device_id": str(self.device_id),
            "cudnn_conv_algo_search": self.cudnn_conv_algo_search,
            "arena_extend_strategy": self.arena_extend_strategy,
            "do_copy_in_default_stream": "1",
        }
        if self.gpu_mem_limit:
            options["gpu_mem_limit"] = str(self.gpu_mem_limit)
        return options


def providers_with_options(providers: list[str], cuda: CudaOptions) -> list[str | tuple[str, dict[str, str]]]:
    """``providers`` as ``InferenceSession(providers=...)`` takes them, CUDA with its options."""
    return [(name, cuda.provider_options()) if name == CUDA else name for name in providers]


class OrtRunner:
    """One ONNX Runtime inference session (one model instance).

    ``run`` is blocking and thread-safe in ONNX Runtime; the batcher calls it from a thread of
    its own (ORT releases the GIL while it computes).

    Args:
        path: the ``model.onnx`` file.
        device: "auto", "cuda" or "cpu" (see :func:`requested_providers`).
        intra_op_threads: threads parallelising one run (0: ORT's default, one per physical core).
        inter_op_threads: threads running independent nodes at once (0: ORT's default).
        intra_op_spinning: let the intra-op threads busy-wait for work while a run is in progress
            (ORT's default is on, and spinning on after the run too); they stop when it returns.
        io_binding: run through an IO binding, the batch bound on the session's device.
        cuda: the CUDA provider's options (None: the defaults of :class:`CudaOptions`).
    """

    def __init__(
        self,
        path: Path,
        *,
        device: Literal["auto", "cuda", "cpu"],
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        intra_op_spinning: bool = False,
        io_binding: bool = False,
        cuda: CudaOptions | None = None,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        spin = "1" if intra_op_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        options.add_session_config_entry("session.force_spinning_stop", spin)  # spin only while a run runs
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        requested = requested_providers(device)
        if CUDA in requested:
            preload_cuda_libraries()
        self.cuda = cuda or CudaOptions()
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=providers_with_options(requested, self.cuda)
        )
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
        inputs = self.session.get_inputs()
        self.input_name = inputs[0].name
        self.mask_name = inputs[1].name if len(inputs) > 1 else None  # a pixel_mask, when the graph takes one
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.io_binding = io_binding
        self.device_type = "cuda" if choice.primary == CUDA else "cpu"
        log.info("loaded %s: providers requested %s, in use %s", path, requested, in_use)

    def close(self) -> None:
        """Let go of the session (its memory is freed with the last reference); ``run`` fails after."""
        self.session = None

    def run(self, batch: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Run the graph on one batch.

        Args:
            batch: float32 array (B, C, H, W).
            mask: int64 (B, H, W), 1 on image pixels and 0 on padding, for a graph with a
                ``pixel_mask`` input; None there: all ones (every pixel real, as transformers'
                default). Ignored by a graph without one.

        Returns:
            Each output by name, with the batch axis first (B, ...), in host memory.
        """
        feed = {self.input_name: batch}
        if self.mask_name is not None:
            feed[self.mask_name] = mask if mask is not None else np.ones((batch.shape[0], *batch.shape[2:]), np.int64)
        if self.io_binding:
            return self._run_bound(feed)
        outputs = self.session.run(self.output_names, feed)
        return dict(zip(self.output_names, outputs, strict=True))

    def _run_bound(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run through an IO binding: the inputs copied once to the session's device, the outputs
        allocated there by ORT and copied back to host memory once."""
        binding = self.session.io_binding()
        for name, array in feed.items():
            value: Any = ort.OrtValue.ortvalue_from_numpy(array, self.device_type, self.cuda.device_id)
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, self.device_type, self.cuda.device_id)
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu(), strict=True))
