"""Rotary position embedding (rotate-half / NeoX layout), with Llama-3 or linear frequency scaling."""

from __future__ import annotations

import math

import torch
from torch import nn


def _inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type") or "default"
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # positions divided by ``factor`` (Gemma 3's global layers)
        return inv_freq / rope_scaling["factor"]
    if rope_type != "llama3":
        raise NotImplementedError(f"rope_scaling type {rope_type!r} is not supported")
    factor = rope_scaling["factor"]
    low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    old_len = rope_scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float, rope_scaling: dict | None = None):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = _inv_freq(head_dim, base, rope_scaling)  # [head_dim / 2]
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_position, head_dim / 2]
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [n, heads, head_dim], k: [n, kv_heads, head_dim], positions: [n] -> rotated (q, k)."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [n, head_dim / 2] each
        cos = torch.cat([cos, cos], dim=-1).unsqueeze(1).to(q.dtype)  # [n, 1, head_dim]
        sin = torch.cat([sin, sin], dim=-1).unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
