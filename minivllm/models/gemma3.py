"""Gemma 3's text model: ``Gemma3ForCausalLM`` checkpoints (1B) and the language model of
``Gemma3ForConditionalGeneration`` ones (4B, 12B, 27B), whose vision tower is not loaded.

What sets Gemma apart from the Llama decoder (each as transformers' ``modeling_gemma3``): the embedding scaled
by sqrt(hidden) in the embedding's dtype; RMSNorms of ``(1 + weight)`` in float32, four per layer (before and
after attention, before and after the MLP) and one on each head's q and k; a GELU-tanh gated MLP; attention
scaled by ``query_pre_attn_scalar ** -0.5``; five sliding layers for each global one (``layer_types``), the
sliding ones with their own RoPE base (``rope_local_base_freq``) and the global ones with ``rope_theta`` and
``rope_scaling`` (linear for 4B-27B); tied embeddings; and, for ``Gemma3ForCausalLM``,
``final_logit_softcapping`` where set.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.config.gemma3 import GELU_APPROXIMATIONS
from minivllm.config.model import ArchConfig
from minivllm.distributed.group import TPGroup
from minivllm.layers.activation import GeluAndMul
from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.layernorm import GemmaRMSNorm
from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.layers.rotary import RotaryEmbedding


class Gemma3Attention(nn.Module):
    """q/k/v projection, per-head q/k Gemma RMSNorm, RoPE (the layer type's base), paged attention over the
    layer's window, output projection (summed over tensor-parallel ranks here: the next norm reads whole rows)."""

    def __init__(self, cfg: ArchConfig, layer: int, max_position: int, backend: str,
                 tp_group: TPGroup | None = None):
        super().__init__()
        sliding = cfg.layer_types is not None and cfg.layer_types[layer] == "sliding_attention"
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=cfg.attention_bias, tp_group=tp_group)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size,
                                        bias=cfg.attention_bias, tp_group=tp_group)
        if sliding:
            self.rotary_emb = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_local_theta or cfg.rope_theta)
        else:
            self.rotary_emb = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        self.attn = Attention(self.num_heads, self.head_dim, scale, self.num_kv_heads, backend,
                              cfg.sliding_window_of(layer))
        self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.fused = backend == "triton"

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """``x`` [n, hidden] at ``positions`` [n] -> [n, hidden]."""
        qkv = self.qkv_proj(x)  # [n, (heads + 2 * kv_heads) * head_dim]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # [n, heads, head_dim]
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # [n, kv_heads, head_dim]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        kv_stored = False
        if self.fused:  # one kernel: q/k norm (weights 1 + w in float32) + RoPE in place, k and v to the cache
            from minivllm.kernels.fused_rope import qk_norm_rope

            kv_store = self.attn.kv_store_args(v, meta)
            q, k = qk_norm_rope(q, k, positions, self.rotary_emb.cos_sin_cache, self.q_norm.scale(),
                                self.k_norm.scale(), self.q_norm.eps, inplace=True, kv_store=kv_store)
            kv_stored = kv_store is not None
        else:
            q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        o = self.attn(q, k, v, meta, kv_stored=kv_stored)  # [n, heads, head_dim]
        return self.o_proj(o.flatten(1, 2))


class Gemma3MLP(nn.Module):
    """``down(gelu(gate(x)) * up(x))``, summed over tensor-parallel ranks."""

    def __init__(self, cfg: ArchConfig, tp_group: TPGroup | None = None):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2,
                                                       tp_group=tp_group)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, tp_group=tp_group)
        self.act_fn = GeluAndMul(GELU_APPROXIMATIONS[cfg.hidden_act])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # gate_up: [n, 2 * intermediate]


class Gemma3DecoderLayer(nn.Module):
    """Norm, attention, norm, residual add; norm, MLP, norm, residual add. The add before each pre-norm happens
    in that norm (``x + residual``), so the layer hands on ``(x, residual)`` as the Llama layers do."""

    def __init__(self, cfg: ArchConfig, layer: int, max_position: int, backend: str,
                 tp_group: TPGroup | None = None):
        super().__init__()
        fused = backend == "triton"
        self.self_attn = Gemma3Attention(cfg, layer, max_position, backend, tp_group)
        self.mlp = Gemma3MLP(cfg, tp_group)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [n, hidden] (the previous block's output, not yet added to ``residual``) -> (this layer's MLP
        output after its norm, the residual stream before it)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(positions, x, meta))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3Model(nn.Module):
    """Scaled embedding, the decoder layers, the final norm: hidden states of every token."""

    def __init__(self, cfg: ArchConfig, max_position: int, backend: str, tp_group: TPGroup | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp_group)
        # sqrt(hidden) in float32, cast to the embedding's dtype where it is applied (as transformers does)
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32),
                             persistent=False)
        self.layers = nn.ModuleList([Gemma3DecoderLayer(cfg, i, max_position, backend, tp_group)
                                     for i in range(cfg.num_hidden_layers)])
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend == "triton")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """``input_ids`` [n] at ``positions`` [n] -> hidden states [n, hidden]."""
        x = self.embed_tokens(input_ids)  # [n, hidden]
        x, residual = x * self.embed_scale.to(x.dtype), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, meta)
        x, _ = self.norm(x, residual)
        return x


class Gemma3ForCausalLM(nn.Module):
    """``Gemma3ForCausalLM`` checkpoints: ``forward`` gives hidden states of every token, ``compute_logits`` the
    (soft-capped, where the config says) logits of the sampled rows."""

    # HF checkpoint name -> (our fused parameter, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ArchConfig, max_position: int | None = None, backend: str = "torch",
                 tp_group: TPGroup | None = None):
        super().__init__()
        max_position = max_position or cfg.max_position_embeddings
        self.model = Gemma3Model(cfg, max_position, backend, tp_group)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_group)
        self.tie_word_embeddings = cfg.tie_word_embeddings
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.softcap = cfg.final_logit_softcapping

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [n, hidden] of every token of the step."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor, gather: bool = True) -> torch.Tensor | None:
        """[rows, vocab] on rank 0 (None on ranks > 0); ``gather=False``: each rank's [rows, per_rank] slice."""
        logits = self.lm_head(hidden, gather)
        if logits is None or self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The language model of a ``Gemma3ForConditionalGeneration`` checkpoint, for text prompts: its weights under
    ``model.language_model.`` (transformers 5.x) or ``language_model.model.`` (the published 4.x files); the
    vision tower and projector are skipped when loading (``ignored_checkpoint_prefixes``)."""

    checkpoint_substr_mapping = {"model.language_model.": "model.", "language_model.model.": "model.",
                                 "language_model.lm_head.": "lm_head."}
    ignored_checkpoint_prefixes = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                   "model.multi_modal_projector.")
