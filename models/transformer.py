"""DETR's transformer encoder-decoder (Carion et al., 2020, Sec. 3.2 and Fig. 10).

Differences from the original Transformer, as in DETR:

* the spatial position encoding is added to the queries and keys of every attention layer
  (not once to the input), and never to the values;
* the decoder decodes all N object queries in parallel (no causal mask); its input starts as
  zeros and the learned query embeddings are added, like positions, to its queries and keys;
* the decoder returns every layer's output (after a shared final LayerNorm) for the
  auxiliary losses.

``normalize_before=False`` is the paper's post-norm layer; ``True`` the pre-norm variant
(DETR's ``--pre_norm``), which then also normalises the encoder's output. Tensors are
batch-first: (B, T, d). A padding mask (True on padded feature-map positions) keeps every
attention from reading padded keys: the encoder's self-attention and the decoder's
cross-attention (DETR's ``src_key_padding_mask`` and ``memory_key_padding_mask``). A query
mask (True where query i may attend to query j) restricts the decoder's self-attention, as
Group DETR does to keep its query groups apart in training (Chen et al. 2023, Sec. 3.2).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    """Multi-head attention with separate query, key and value inputs.

    The parameters are laid out as ``nn.MultiheadAttention``'s (``in_proj_weight`` (3d, d)
    stacking the q, k, v projections, ``in_proj_bias``, ``out_proj``), so DETR's weights load
    by name; the computation is ``F.scaled_dot_product_attention`` on batch-first tensors.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"num_heads {num_heads} does not divide hidden_size {hidden_size}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * hidden_size, hidden_size))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * hidden_size))
        self.out_proj = nn.Linear(hidden_size, hidden_size)
        self.dropout = dropout
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, x: torch.Tensor, index: int) -> torch.Tensor:
        d = self.in_proj_bias.shape[0] // 3
        projected = F.linear(
            x, self.in_proj_weight[index * d : (index + 1) * d], self.in_proj_bias[index * d : (index + 1) * d]
        )
        B, T, _ = projected.shape
        return projected.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, heads, T, head_dim)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args: query (B, Tq, d), key and value (B, Tk, d), key_padding_mask bool (B, Tk), True
        on keys to ignore; attn_mask bool (Tq, Tk), True where a query may attend to a key (each
        query keeps at least one key). Returns (B, Tq, d)."""
        q, k, v = self._heads(query, 0), self._heads(key, 1), self._heads(value, 2)
        attend = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
        if attn_mask is not None:
            attend = attn_mask if attend is None else attend & attn_mask  # (Tq, Tk) or (B, 1, Tq, Tk)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attend, dropout_p=self.dropout if self.training else 0.0
        )
        B, _, Tq, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, -1))  # (B, Tq, d)


def _with_pos(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    return x if pos is None else x + pos


class EncoderLayer(nn.Module):
    """Self-attention (position added to q and k) and a ReLU FFN, each with a residual and LayerNorm."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, dropout: float, normalize_before: bool) -> None:
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads, dropout)
        self.linear1 = nn.Linear(hidden_size, ffn_size)
        self.linear2 = nn.Linear(ffn_size, hidden_size)
        self.norm1 = nn.LayerNorm(hidden_size)
        self.norm2 = nn.LayerNorm(hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))

    def forward(self, src: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args: src and pos (B, HW, d), mask bool (B, HW) True on padding. Returns (B, HW, d)."""
        if self.normalize_before:
            x = self.norm1(src)
            src = src + self.dropout(self.self_attn(_with_pos(x, pos), _with_pos(x, pos), x, mask))
            return src + self.dropout(self._ffn(self.norm2(src)))
        src = self.norm1(src + self.dropout(self.self_attn(_with_pos(src, pos), _with_pos(src, pos), src, mask)))
        return self.norm2(src + self.dropout(self._ffn(src)))


class DecoderLayer(nn.Module):
    """Self-attention among the queries, cross-attention to the image, a ReLU FFN.

    The query embeddings are added to the queries and keys of the self-attention and to the
    queries of the cross-attention; the spatial positions to the cross-attention's keys.
    """

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, dropout: float, normalize_before: bool) -> None:
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads, dropout)
        self.multihead_attn = Attention(hidden_size, num_heads, dropout)
        self.linear1 = nn.Linear(hidden_size, ffn_size)
        self.linear2 = nn.Linear(ffn_size, hidden_size)
        self.norm1 = nn.LayerNorm(hidden_size)
        self.norm2 = nn.LayerNorm(hidden_size)
        self.norm3 = nn.LayerNorm(hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.relu(self.linear1(x))))

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        pos: torch.Tensor,
        query_pos: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args: tgt and query_pos (B, N, d); memory and pos (B, HW, d); memory_mask bool (B, HW)
        True on padding; query_mask bool (N, N), True where query i may attend to query j (None:
        all). Returns (B, N, d)."""
        if self.normalize_before:
            x = self.norm1(tgt)
            # q and k as two sums, as before the query mask: one shared sum reorders the gradient's additions
            q, k = _with_pos(x, query_pos), _with_pos(x, query_pos)
            tgt = tgt + self.dropout(self.self_attn(q, k, x, attn_mask=query_mask))
            x = self.norm2(tgt)
            attended = self.multihead_attn(_with_pos(x, query_pos), _with_pos(memory, pos), memory, memory_mask)
            tgt = tgt + self.dropout(attended)
            return tgt + self.dropout(self._ffn(self.norm3(tgt)))
        q = k = _with_pos(tgt, query_pos)
        tgt = self.norm1(tgt + self.dropout(self.self_attn(q, k, tgt, attn_mask=query_mask)))
        attended = self.multihead_attn(_with_pos(tgt, query_pos), _with_pos(memory, pos), memory, memory_mask)
        tgt = self.norm2(tgt + self.dropout(attended))
        return self.norm3(tgt + self.dropout(self._ffn(tgt)))


class Transformer(nn.Module):
    """DETR's encoder-decoder.

    Args:
        hidden_size: the width d.
        num_heads: attention heads (d must divide by it).
        num_encoder_layers, num_decoder_layers: depths (6 and 6 in the paper).
        ffn_size: hidden width of the feed-forward layers (2048 in the paper).
        dropout: dropout in attention, FFN and residuals (0.1 in the paper).
        normalize_before: pre-norm layers (False: the paper's post-norm).
    """

    def __init__(
        self,
        hidden_size: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        ffn_size: int = 2048,
        dropout: float = 0.1,
        normalize_before: bool = False,
    ) -> None:
        super().__init__()
        layer_args = (hidden_size, num_heads, ffn_size, dropout, normalize_before)
        self.encoder_layers = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(num_encoder_layers))
        self.encoder_norm = nn.LayerNorm(hidden_size) if normalize_before else None
        self.decoder_layers = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(num_decoder_layers))
        self.decoder_norm = nn.LayerNorm(hidden_size)
        self.hidden_size = hidden_size
        for parameter in self.parameters():  # DETR's _reset_parameters
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def forward(
        self,
        src: torch.Tensor,
        query_embed: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None = None,
        query_mask: torch.Tensor | None = None,
        tgt: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode the image, decode the queries.

        Args:
            src: projected backbone features (B, d, H, W).
            query_embed: the object queries' positions, (N, d) shared by the batch or (B, N, d).
            pos: the position encoding of ``src`` (B, d, H, W).
            mask: bool (B, H, W), True on padded positions of ``src``; None: none padded.
            query_mask: bool (N, N), True where query i may attend to query j in the decoder's
                self-attention; None: every query sees every other.
            tgt: the queries' initial content (B, N, d); None: zeros, as DETR's.

        Returns:
            Every decoder layer's output after the final LayerNorm, (L, B, N, d); the last
            one, ``[-1]``, feeds the prediction heads.
        """
        B = src.shape[0]
        memory = src.flatten(2).transpose(1, 2)  # (B, HW, d)
        pos = pos.flatten(2).transpose(1, 2)  # (B, HW, d)
        padding = None if mask is None else mask.flatten(1)  # (B, HW)
        for layer in self.encoder_layers:
            memory = layer(memory, pos, padding)
        if self.encoder_norm is not None:
            memory = self.encoder_norm(memory)

        query_pos = query_embed if query_embed.dim() == 3 else query_embed.unsqueeze(0).expand(B, -1, -1)  # (B, N, d)
        tgt = torch.zeros_like(query_pos) if tgt is None else tgt
        intermediate = []
        for layer in self.decoder_layers:
            tgt = layer(tgt, memory, pos, query_pos, padding, query_mask)
            intermediate.append(self.decoder_norm(tgt))
        return torch.stack(intermediate)  # (L, B, N, d)
