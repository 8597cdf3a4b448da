"""Image embeddings: each image's pooled representation, for retrieval and de-duplication.

Route ``POST /v1/models/{name}/embed`` (``?normalize=false`` for the raw vector); output role
``embedding``, float32 (B, D): the representation the classifier head takes, after the final
LayerNorm (a ViT's class token; other families define their own pooling, and their exporter
writes it). A companion task: any model whose manifest names an ``embedding`` output serves
``embed`` beside its own task, so a ViT classifier exported with one serves both ``classify``
and ``embed``. Over the Open Inference Protocol it is one more output tensor, raw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, Field

from service.tasks.base import BaseTask, output, register, result_schema

if TYPE_CHECKING:
    from service.pipeline.inference import ImageOutcome
    from service.runtime.repository import ModelVersion


def embed(features: np.ndarray, *, normalize: bool = True) -> list[float]:
    """One image's embedding as a JSON list.

    Args:
        features: float (D,), the graph's ``embedding`` row for one image.
        normalize: divide by the L2 norm, so that a dot product of two embeddings is their
            cosine similarity (an all-zero vector stays zero).

    Returns:
        D floats (float32 values), unit L2 norm when ``normalize``.

    Raises:
        ValueError: ``features`` is not one vector.
    """
    if features.ndim != 1:
        raise ValueError(f"expected one embedding (D,), got {features.shape}")
    vector = features.astype(np.float32)
    if normalize:
        norm = float(np.linalg.norm(vector.astype(np.float64)))
        vector = vector / np.float32(norm) if norm > 0 else vector
    values: list[float] = vector.tolist()  # numpy types tolist() Any
    return values


class EmbedParams(BaseModel):
    """``embed``'s query parameters."""

    normalize: bool = Field(True, description="L2-normalise the embedding (false: the raw pooled representation)")


_EMBEDDING = {
    "type": "array",
    "items": {"type": "number"},
    "description": "The pooled representation after the final LayerNorm (a ViT's class token), "
    "L2-normalised unless normalize=false.",
}


class Embedding(BaseTask[EmbedParams]):
    """Image embeddings (:func:`embed`), served by any model that exports an ``embedding`` output."""

    name = "embedding"
    verb = "embed"
    summary = "Embed one or more images (their pooled feature vectors)"
    roles = ("embedding",)
    companion = True
    Params = EmbedParams
    result_schema = result_schema(
        "Embedding", {"embedding": _EMBEDDING, "dimensions": {"type": "integer", "minimum": 1}}
    )

    def fields(self, model: ModelVersion, outcome: ImageOutcome, params: EmbedParams) -> dict[str, Any]:
        """``{"embedding": [D floats], "dimensions": D}``."""
        vector = embed(output(model, outcome, "embedding"), normalize=params.normalize)
        return {"embedding": vector, "dimensions": len(vector)}


TASK = register(Embedding())
