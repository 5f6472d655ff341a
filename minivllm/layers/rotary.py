"""Rotary position embedding (rotate-half / NeoX layout), with Llama-3, linear or YaRN frequency scaling."""

from __future__ import annotations

import math

import torch
from torch import nn


def _inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type") or "default"
    if rope_type == "default":
        return inv_freq
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, rope_scaling)
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


def _yarn_correction_range(rope_scaling: dict, head_dim: int, base: float) -> tuple[float, float]:
    """The dimension pairs between which YaRN ramps from extrapolated to interpolated frequencies
    (transformers' ``find_correction_range``, floored / ceiled unless ``truncate`` is false)."""
    old_len = rope_scaling["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(rope_scaling.get("beta_fast") or 32), dim_of(rope_scaling.get("beta_slow") or 1)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def _yarn_inv_freq(head_dim: int, base: float, rope_scaling: dict) -> torch.Tensor:
    """YaRN's frequencies: the original ones for the fast dimensions, divided by ``factor`` for the slow ones, a
    linear ramp between (transformers' ``_compute_yarn_parameters``)."""
    pos_freqs = base ** (torch.arange(0, head_dim, 2).float() / head_dim)  # [head_dim / 2]
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (rope_scaling["factor"] * pos_freqs)
    low, high = _yarn_correction_range(rope_scaling, head_dim, base)
    if low == high:
        high += 0.001  # the ramp's width may not be 0
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # [head_dim / 2]: 1 where the frequency is kept (extrapolated)
    return interpolated * (1 - keep) + extrapolated * keep


def attention_factor(rope_scaling: dict | None) -> float:
    """What cos and sin are multiplied by: YaRN's ``attention_factor`` (given, or ``0.1 ln(factor) + 1``, through
    ``mscale`` / ``mscale_all_dim`` where both are set); 1.0 for the other RoPE types."""
    rope_scaling = rope_scaling or {}
    if (rope_scaling.get("rope_type") or rope_scaling.get("type")) != "yarn":
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor = rope_scaling["factor"]

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if rope_scaling.get("mscale") and rope_scaling.get("mscale_all_dim"):
        return float(mscale(rope_scaling["mscale"]) / mscale(rope_scaling["mscale_all_dim"]))
    return mscale()


class RotaryEmbedding(nn.Module):
    """cos and sin of every position up to ``max_position`` (``cos_sin_cache [max_position, head_dim]``: the cos
    half then the sin half, times YaRN's attention factor where it applies), and their rotation of q and k."""

    def __init__(self, head_dim: int, max_position: int, base: float, rope_scaling: dict | None = None):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = _inv_freq(head_dim, base, rope_scaling)  # [head_dim / 2]
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_position, head_dim / 2]
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [max_position, head_dim]
        mscale = attention_factor(rope_scaling)
        self.register_buffer("cos_sin_cache", cos_sin if mscale == 1.0 else cos_sin * mscale, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [n, heads, head_dim], k: [n, kv_heads, head_dim], positions: [n] -> rotated (q, k)."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [n, head_dim / 2] each
        cos = torch.cat([cos, cos], dim=-1).unsqueeze(1).to(q.dtype)  # [n, 1, head_dim]
        sin = torch.cat([sin, sin], dim=-1).unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
