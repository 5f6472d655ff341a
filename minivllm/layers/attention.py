"""Paged attention layer: this step's K/V go into the cache, then the queries attend over it."""

from __future__ import annotations

import torch
from torch import nn

from minivllm.kernels.torch_backend import fp8_max, paged_attention_ref, paged_decode_torch, store_kvcache_ref
from minivllm.layers.attention_metadata import AttentionMetadata


class Attention(nn.Module):
    """Attention over a paged KV cache; ``k_cache``/``v_cache`` are bound by the model runner.

    backend "torch": the reference (CPU, obviously right); "triton": the GPU kernels, where the q/k norm + RoPE
    kernel stores this step's K/V (:meth:`kv_store_args` gives it the cache).

    An FP8 cache holds ``K / k_scale`` and ``V / v_scale``: the checkpoint's per-layer scales where it has them
    (:meth:`load_kv_scale`), else 1.0. A cache in the model's dtype ignores them.

    ``sliding_window``: the query at position p attends to keys (p - sliding_window, p] only (None: all of
    0..p). ``kv_group``: the layer's KV cache group (set by the runner), whose block tables and slot mapping it
    reads (``AttentionMetadata.for_group``); a sliding window's group releases the blocks left behind, and the
    kernels never read them.

    ``sinks`` (gpt-oss; None elsewhere): a parameter of one logit per local query head, set by the model, that
    joins each softmax denominator and nothing else.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int, backend: str = "torch",
                 sliding_window: int | None = None):
        super().__init__()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        self.backend, self.sliding_window = backend, sliding_window
        self.k_cache = self.v_cache = torch.tensor([])
        self.kv_group = 0
        self.k_scale = self.v_scale = 1.0
        self.sinks: nn.Parameter | None = None  # [num_heads]

    def load_kv_scale(self, which: str, loaded: torch.Tensor) -> None:
        """Take a checkpoint's ``k_scale`` / ``v_scale`` (``which``: "k" or "v"; one positive value)."""
        value = float(loaded.float().max())  # some checkpoints store one value per shard: the largest covers all
        if not value > 0.0 or value == float("inf"):
            raise ValueError(f"the checkpoint's {which}_scale must be positive and finite, got {value}")
        setattr(self, f"{which}_scale", value)

    def kv_scales(self) -> tuple[float, float]:
        """(k_scale, v_scale) as the cache is read and written: (1.0, 1.0) unless the cache is FP8."""
        if fp8_max(self.k_cache.dtype):
            return self.k_scale, self.v_scale
        return 1.0, 1.0

    def kv_store_args(self, v: torch.Tensor, meta: AttentionMetadata) -> tuple | None:
        """``(v, k_cache, v_cache, slot_mapping)`` for a kernel that stores this step's K/V itself, or None
        without a cache."""
        if self.k_cache.numel() == 0:
            return None
        if self.kv_group:
            meta = meta.for_group(self.kv_group)
        return v, self.k_cache, self.v_cache, meta.slot_mapping, *self.kv_scales()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                kv_stored: bool = False) -> torch.Tensor:
        """q: [n, heads, head_dim], k/v: [n, kv_heads, head_dim] -> [n, heads, head_dim].

        ``kv_stored``: k and v are already in the cache (given to the kernel :meth:`kv_store_args` feeds).
        """
        if self.k_cache.numel() == 0:
            raise RuntimeError("the KV cache is not allocated")
        if self.kv_group:
            meta = meta.for_group(self.kv_group)
        k_scale, v_scale = self.kv_scales()
        if not kv_stored:
            store_kvcache_ref(k, v, self.k_cache, self.v_cache, meta.slot_mapping, k_scale, v_scale)
        if self.backend == "triton":
            from minivllm.kernels.triton_backend import triton_attention

            return triton_attention(q, self.k_cache, self.v_cache, meta, self.scale * k_scale, v_scale,
                                    self.sliding_window, self.sinks)
        if meta.is_decode and meta.context_lens_cpu:
            o = paged_decode_torch(q, self.k_cache, self.v_cache, meta.context_lens_cpu, meta.block_tables,
                                   self.scale * k_scale, self.sliding_window, self.sinks)
        else:
            o = paged_attention_ref(q, self.k_cache, self.v_cache, meta.cu_seqlens_q_cpu or meta.cu_seqlens_q,
                                    meta.context_lens_cpu or meta.context_lens, meta.block_tables, self.scale * k_scale,
                                    self.sliding_window, self.sinks)
        return o if v_scale == 1.0 else o * v_scale
