"""One decoder layer's decode-step kernels as the engine launches them (one tensor-parallel rank, no
all-reduce), on random weights: ``tests/gpu/test_pdl_gpu.py`` checks that programmatic dependent launch
leaves their results unchanged.

The defaults are a Qwen3-8B layer on one of 2 ranks: hidden 4096, 16 query and 4 KV heads of 128,
intermediate 6144; every row decodes one token after a context of its own length.
"""

from __future__ import annotations

import torch
import triton

from minivllm.kernels.fused_act import silu_and_mul
from minivllm.kernels.fused_norm import fused_add_rms_norm, rms_norm
from minivllm.kernels.fused_rope import qk_norm_rope
from minivllm.kernels.gemv import gemv
from minivllm.kernels.paged_decode import paged_decode

EPS = 1e-6
BLOCK_SIZE = 256


class DecodeLayer:
    """Weights, a paged KV cache and step inputs for ``rows`` decoding rows (contexts up to ``context``)."""

    def __init__(self, rows: int, hidden: int = 4096, heads: int = 16, kv_heads: int = 4, head_dim: int = 128,
                 inter: int = 6144, context: int = 1024, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 device: str = "cuda"):
        self.rows, self.heads, self.kv_heads, self.head_dim = rows, heads, kv_heads, head_dim
        g = torch.Generator(device=device).manual_seed(seed)

        def rnd(*shape, scale=1.0):
            return (torch.empty(*shape, device=device, dtype=dtype).normal_(generator=g) * scale)

        self.w_qkv = rnd((heads + 2 * kv_heads) * head_dim, hidden, scale=hidden**-0.5)  # [Nqkv, hidden]
        self.w_o = rnd(hidden, heads * head_dim, scale=(heads * head_dim) ** -0.5)  # [hidden, heads * hd]
        self.w_gate_up = rnd(2 * inter, hidden, scale=hidden**-0.5)  # [2 inter, hidden]
        self.w_down = rnd(hidden, inter, scale=inter**-0.5)  # [hidden, inter]
        self.norm1, self.norm2 = 1 + 0.1 * rnd(hidden), 1 + 0.1 * rnd(hidden)  # [hidden]
        self.q_norm, self.k_norm = 1 + 0.1 * rnd(head_dim), 1 + 0.1 * rnd(head_dim)  # [hd]
        self.cos_sin = torch.randn(context, head_dim, device=device, generator=g)  # [max_pos, hd] float32
        # row r decodes position ctx_r - 1 after ctx_r - 1 cached keys; contexts differ row to row
        ctx = [max(1, context - (97 * r) % max(1, context // 2)) for r in range(rows)]
        per_row = triton.cdiv(context, BLOCK_SIZE)
        num_blocks = rows * per_row
        self.k_cache = rnd(num_blocks, BLOCK_SIZE, kv_heads, head_dim)  # [blocks, block, kv, hd]
        self.v_cache = rnd(num_blocks, BLOCK_SIZE, kv_heads, head_dim)
        perm = torch.randperm(num_blocks, device=device, generator=g).to(torch.int32)
        self.block_tables = perm.view(rows, per_row)  # [rows, per_row] int32
        self.context_lens = torch.tensor(ctx, dtype=torch.int32, device=device)  # [rows]
        self.positions = (self.context_lens - 1).to(torch.int64)  # [rows]
        last = self.positions // BLOCK_SIZE
        self.slots = (self.block_tables.gather(1, last[:, None]).squeeze(1).to(torch.int64) * BLOCK_SIZE
                      + self.positions % BLOCK_SIZE)  # [rows]
        self.max_context = context
        self.x = rnd(rows, hidden)  # [rows, hidden] the layer's input
        self.residual = rnd(rows, hidden)  # [rows, hidden]

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's 10 kernels: norm, qkv, q/k norm + RoPE + KV store, attention (split-KV: 2), o,
        add + norm, gate_up, SiLU-and-mul, down. Returns ``(mlp output, new residual)``, each [rows, hidden]."""
        n, hq, hkv, hd = self.rows, self.heads, self.kv_heads, self.head_dim
        h = rms_norm(x, self.norm1, EPS)  # [n, hidden]
        qkv = gemv(h, self.w_qkv)  # [n, (hq + 2 hkv) hd]
        q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        q, k = qk_norm_rope(q.view(n, hq, hd), k.view(n, hkv, hd), self.positions, self.cos_sin,
                            self.q_norm, self.k_norm, EPS, inplace=True,
                            kv_store=(v.view(n, hkv, hd), self.k_cache, self.v_cache, self.slots))
        o = paged_decode(q, self.k_cache, self.v_cache, self.context_lens, self.block_tables, hd**-0.5,
                         self.max_context)  # [n, hq, hd]
        y = gemv(o.view(n, hq * hd), self.w_o)  # [n, hidden]
        y, residual = fused_add_rms_norm(y, residual, self.norm2, EPS)
        act = silu_and_mul(gemv(y, self.w_gate_up))  # [n, inter]
        return gemv(act, self.w_down), residual
