"""The GPU attention backend: one paged-attention launch for the step (split-KV for small decode batches)."""

from __future__ import annotations

import torch

from minivllm.kernels.paged_attention import paged_attention
from minivllm.kernels.paged_decode import paged_decode
from minivllm.layers.attention_metadata import AttentionMetadata


def triton_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    v_scale: float = 1.0,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Attend over the paged cache, which already holds this step's K/V (an FP8 cache: ``K / k_scale`` and
    ``V / v_scale``, with ``scale`` given times ``k_scale``), over the last ``sliding_window`` keys of each
    query where it is set, with each head's ``sinks`` logit in its softmax denominator where given."""
    if meta.is_decode:
        # NOTE: decode-only steps may run inside a CUDA graph: nothing here reads device values.
        return paged_decode(q, k_cache, v_cache, meta.context_lens, meta.block_tables, scale, meta.max_context_len,
                            v_scale=v_scale, sliding_window=sliding_window, sinks=sinks)
    return paged_attention(q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens, meta.block_tables, scale,
                           meta.max_seqlen_q, meta.max_context_len, v_scale=v_scale, sliding_window=sliding_window,
                           sinks=sinks)
