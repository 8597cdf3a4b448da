"""Export a PyTorch module to one ONNX file with the dynamo exporter, and prove it.

Every export is checked by ``onnx.checker`` and compared with PyTorch through ONNX Runtime at
batch size 1 and at a larger batch (timm's ``onnx_export(check_forward=True)`` and DETR's
ONNX test do the same). The measured error goes into the manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from service.runtime.manifest import ExportInfo

log = logging.getLogger(__name__)

DEFAULT_OPSET = 18
PARITY_TOLERANCE = 1e-4


class ParityError(RuntimeError):
    """ONNX Runtime and PyTorch disagree by more than the tolerance."""


def export_onnx(
    model: nn.Module,
    example: torch.Tensor,
    path: Path,
    *,
    input_name: str = "pixel_values",
    output_names: Sequence[str] = ("logits",),
    dynamic_hw: bool = False,
    mask: torch.Tensor | None = None,
    mask_name: str = "pixel_mask",
    opset: int = DEFAULT_OPSET,
) -> None:
    """Export ``model`` (in eval mode) to ``path`` as a single self-contained ONNX file.

    Args:
        model: maps float32 (B, C, H, W) (and, with ``mask``, the mask) to the tensors named by
            ``output_names``.
        example: an example input (B, C, H, W) used for tracing.
        path: where to write ``model.onnx``.
        input_name: the graph's input name.
        output_names: names for the model's outputs, in order.
        dynamic_hw: also make H and W symbolic (for models that accept any size).
        mask: an example int64 (B, H, W) pixel mask, 1 on real pixels and 0 on padding (Carion et
            al. 2020, Sec. 4; transformers' ``pixel_mask``): the graph gets it as a second input,
            ``mask_name``, sharing the image's batch, height and width axes (symbolic H and W:
            padded batches come in several shapes).
        mask_name: the second input's name.
        opset: ONNX opset version.

    Raises:
        onnx.checker.ValidationError: the exported graph is not valid ONNX.
    """
    import onnx

    model.eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    axes: dict[int, object] = {0: batch}
    if dynamic_hw or mask is not None:
        height, width = torch.export.Dim("height", min=32, max=4096), torch.export.Dim("width", min=32, max=4096)
        axes.update({2: height, 3: width})
    args: tuple[torch.Tensor, ...] = (example,)
    names = [input_name]
    shapes: tuple[dict[int, object], ...] = (axes,)
    if mask is not None:
        args, names, shapes = (example, mask), [input_name, mask_name], (axes, {0: batch, 1: height, 2: width})
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            input_names=names,
            output_names=list(output_names),
            dynamic_shapes=shapes,
            opset_version=opset,
            external_data=False,
        )
    assert program is not None  # the dynamo exporter returns its ONNXProgram
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)
    log.info("exported %s (%.1f MB)", path, path.stat().st_size / 1e6)


def parity(
    model: nn.Module,
    path: Path,
    inputs: Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]],
    tolerance: float = PARITY_TOLERANCE,
) -> dict[str, float]:
    """Max |ONNX Runtime - PyTorch| over every output, for each input batch.

    Args:
        model: the PyTorch module that was exported.
        path: the exported ``model.onnx``.
        inputs: batches (B, C, H, W) to compare on, e.g. of batch size 1 and 7; for a graph with a
            pixel mask, (pixel values, int64 (B, H, W) mask) pairs, fed to the graph's two inputs
            in order.
        tolerance: the largest accepted absolute difference.

    Returns:
        ``{str(batch_size): max_abs_diff}`` (a later batch of the same size overwrites an earlier).

    Raises:
        ParityError: a difference above ``tolerance``.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    model.eval()
    result = {}
    for batch in inputs:
        tensors = batch if isinstance(batch, tuple) else (batch,)
        with torch.no_grad():
            expected = model(*tensors)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        got = session.run(None, {name: t.numpy() for name, t in zip(input_names, tensors, strict=True)})
        diff = max(float(np.max(np.abs(e.numpy() - g))) for e, g in zip(expected, got, strict=True))
        size = tensors[0].shape[0]
        result[str(size)] = diff
        if diff > tolerance:
            raise ParityError(f"{path}: batch {size}: max |ORT - PyTorch| = {diff:.2e} > {tolerance:.0e}")
    log.info("parity %s: %s", path, result)
    return result


def export_info(opset: int, diffs: dict[str, float]) -> ExportInfo:
    """The manifest's record of an :func:`export_onnx` graph.

    Exporter, opset, torch version and the :func:`parity` measured (max |ONNX Runtime -
    PyTorch| by batch size, as a string key).
    """
    return ExportInfo(
        exporter="torch.onnx.export(dynamo=True)",
        opset=opset,
        torch_version=torch.__version__,
        parity_max_abs_diff=diffs,
    )
