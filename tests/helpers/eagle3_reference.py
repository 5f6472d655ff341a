"""EAGLE-3 test helpers: a plain-torch reference of the head straight from its published tensors, random heads
in the published format, and the attention metadata of one sequence over a contiguous paged cache."""

from __future__ import annotations

import math

import numpy as np
import torch

from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.models.eagle3 import Eagle3Config, Eagle3LlamaForCausalLM
from minivllm.worker.kv_cache import bind_cache, new_cache


def head_config(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, vocab=448, draft_vocab=200,
                target_hidden=None, aux_layers=None, norm_before_residual=False) -> Eagle3Config:
    """A small head's config, through the published config.json layout."""
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inter,
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 512, "torch_dtype": "float32",
           "norm_before_residual": norm_before_residual}
    if target_hidden is not None:
        cfg["target_hidden_size"] = target_hidden
    if aux_layers is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layers)}
    return Eagle3Config.from_dict(cfg)


def random_vocab_maps(vocab: int, draft_vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` of a draft vocabulary of ``draft_vocab`` random target ids, kept in increasing order."""
    gen = torch.Generator().manual_seed(seed)
    target_ids = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values  # [draft_vocab]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return target_ids - torch.arange(draft_vocab), t2d


def random_head(cfg: Eagle3Config, seed: int = 0, std: float = 0.2) -> Eagle3LlamaForCausalLM:
    """A float32 head with seeded random weights (norm weights near 1) and random vocabulary maps."""
    head = Eagle3LlamaForCausalLM(cfg).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
        head.d2t, head.t2d = random_vocab_maps(cfg.arch.vocab_size, cfg.draft_vocab_size, seed)
    return head


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of x [n, heads, d] at ``positions`` [n]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d / 2]
    ang = positions.double()[:, None] * inv[None]  # [n, d / 2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]  # [n, 1, d]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return (x.double() * cos + rot.double() * sin).to(x.dtype)


def reference_step(sd: dict[str, torch.Tensor], cfg: Eagle3Config, input_ids: torch.Tensor,
                   positions: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The head over one sequence whose token ``i`` attends to tokens ``0..i`` (causal), from the published
    tensors ``sd``: ``(normed, prenorm)`` [n, hidden]. ``hidden`` [n, hidden]: each token's hidden input."""
    a = cfg.arch
    eps, hd = a.rms_norm_eps, a.head_dim
    w = {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}
    hidden = hidden.double()
    embeds = _rms(w["embed_tokens.weight"][input_ids], w["midlayer.input_layernorm.weight"], eps)
    h = _rms(hidden, w["midlayer.hidden_norm.weight"], eps)
    residual = h if cfg.norm_before_residual else hidden
    x = torch.cat([embeds, h], -1)  # [n, 2 * hidden]
    n = x.shape[0]
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, a.num_attention_heads, hd)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, a.num_key_value_heads, hd)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, a.num_key_value_heads, hd)
    q, k = _rope(q, positions, a.rope_theta), _rope(k, positions, a.rope_theta)
    group = a.num_attention_heads // a.num_key_value_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [n, heads, hd]
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
    r = o @ w["midlayer.self_attn.o_proj.weight"].T + residual
    y = _rms(r, w["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = y @ w["midlayer.mlp.gate_proj.weight"].T, y @ w["midlayer.mlp.up_proj.weight"].T
    out = (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T + r
    return _rms(out, w["norm.weight"], eps), out


def bind_head_cache(head: torch.nn.Module, num_blocks: int, block_size: int) -> None:
    """Give the head's attention layer a zeroed float32 paged cache on the CPU."""
    layers = [m for m in head.modules() if isinstance(m, Attention)]
    bind_cache(layers, new_cache(layers, num_blocks, block_size, torch.float32, torch.device("cpu")))


def one_sequence_meta(start: int, num_new: int, block_size: int, num_blocks: int) -> AttentionMetadata:
    """Metadata of one sequence computing tokens ``[start, start + num_new)`` over blocks ``0..num_blocks``."""
    slots = np.arange(start, start + num_new, dtype=np.int64)
    ctx = start + num_new
    return AttentionMetadata(
        slot_mapping=torch.from_numpy(slots), cu_seqlens_q=torch.tensor([0, num_new], dtype=torch.int32),
        context_lens=torch.tensor([ctx], dtype=torch.int32),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None], max_seqlen_q=num_new,
        max_context_len=ctx, is_decode=num_new == 1, num_rows=1, cu_seqlens_q_cpu=[0, num_new],
        context_lens_cpu=[ctx], is_fresh_prefill=start == 0)
