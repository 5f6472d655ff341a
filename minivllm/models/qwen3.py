"""Qwen3 (and the Llama / Qwen2 family it generalises) over the paged-attention layers.

Qwen3 = Llama + RMSNorm on each head's q and k before RoPE. Qwen2 = Llama + q/k/v bias. The mixtures of experts
(``moe.py``) are this decoder with a sparse block as some layers' MLP (``make_mlp``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minivllm.config.model import ArchConfig
from minivllm.distributed.group import TPGroup, rank_and_size
from minivllm.layers.activation import SiluAndMul
from minivllm.layers.attention import Attention
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.layernorm import RMSNorm, ShardedRMSNorm
from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.layers.rotary import RotaryEmbedding

QK_NORMS = (None, "head", "full")


class DecoderAttention(nn.Module):
    """q/k/v projection, q/k RMSNorm, RoPE, paged attention, output projection.

    ``qk_norm``: None, ``"head"`` (Qwen3: each head's q and k normalised over ``head_dim``) or ``"full"`` (OLMoE:
    the whole q and k projections, before they split into heads). ``cfg.clip_qkv`` (OLMoE) clamps q, k and v
    after the norms. With a ``tp_group`` the output projection returns this rank's partial sum: the next norm
    sums it. ``sliding_window``: this layer's attention window in tokens (None: the whole context).
    """

    def __init__(self, cfg: ArchConfig, max_position: int, qk_norm: str | None, qkv_bias: bool, backend: str,
                 tp_group: TPGroup | None = None, sliding_window: int | None = None):
        super().__init__()
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS}, got {qk_norm!r}")
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias=qkv_bias, tp_group=tp_group)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size,
                                        reduce_results=False, tp_group=tp_group)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads, backend,
                              sliding_window)
        self.qk_norm, self.clip_qkv = qk_norm, cfg.clip_qkv
        self.fused = backend == "triton"
        if qk_norm == "head":
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        elif qk_norm == "full":
            rank, size = rank_and_size(tp_group)
            replicas = self.qkv_proj.num_kv_replicas
            self.q_norm = ShardedRMSNorm(cfg.num_attention_heads * cfg.head_dim, cfg.rms_norm_eps, tp_group,
                                         size, rank)
            self.k_norm = ShardedRMSNorm(cfg.num_key_value_heads * cfg.head_dim, cfg.rms_norm_eps, tp_group,
                                         size // replicas, rank // replicas, replicas)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [n, (heads + 2 * kv_heads) * head_dim]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)  # [n, heads * head_dim], [n, kv_heads * head_dim]
        if self.clip_qkv is not None:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        q = q.view(-1, self.num_heads, self.head_dim)  # [n, heads, head_dim]
        k = k.view(-1, self.num_kv_heads, self.head_dim)  # [n, kv_heads, head_dim]
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        per_head = self.qk_norm == "head"
        kv_stored = False
        if self.fused:  # one kernel: per-head q/k RMSNorm + RoPE in place in the qkv buffer, k and v to the cache
            from minivllm.kernels.fused_rope import qk_norm_rope

            qw, kw = (self.q_norm.weight, self.k_norm.weight) if per_head else (None, None)
            eps = self.q_norm.eps if per_head else 1e-6
            kv_store = self.attn.kv_store_args(v, meta)
            q, k = qk_norm_rope(q, k, positions, self.rotary_emb.cos_sin_cache, qw, kw, eps, inplace=True,
                                kv_store=kv_store)
            kv_stored = kv_store is not None
        else:
            if per_head:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v, meta, kv_stored=kv_stored)  # [n, heads, head_dim]
        return self.o_proj(o.flatten(1, 2))


class MLP(nn.Module):
    """Gated SiLU MLP; with a ``tp_group`` it returns this rank's partial sum (the next norm sums it)."""

    def __init__(self, cfg: ArchConfig, fused: bool = False, tp_group: TPGroup | None = None):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2,
                                                       tp_group=tp_group)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, reduce_results=False,
                                           tp_group=tp_group)
        self.act_fn = SiluAndMul(fused)

    def input_quant(self, x: torch.Tensor) -> int | None:
        """How the norm before this MLP should hand over its input (``LinearBase.input_quant``)."""
        return self.gate_up_proj.input_quant(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up_proj(x)  # [n, 2 * intermediate]
        return self.down_proj(self.act_fn(h, self.down_proj.input_quant(h)))


class DecoderLayer(nn.Module):
    """Attention (over ``sliding_window`` tokens, or all) then ``mlp`` (a dense :class:`MLP`, or a mixture of
    experts), each after an RMSNorm.

    With a ``tp_group``, o_proj and the MLP return partial sums and the norm that reads each (this layer's
    post-attention norm, the next layer's input norm or the final norm, all given a residual) sums them, in one
    kernel with the add and the norm for decode-sized batches."""

    def __init__(self, cfg: ArchConfig, max_position: int, qk_norm: str | None, qkv_bias: bool, backend: str,
                 mlp: nn.Module, tp_group: TPGroup | None = None, sliding_window: int | None = None):
        super().__init__()
        fused = backend == "triton"
        self.self_attn = DecoderAttention(cfg, max_position, qk_norm, qkv_bias, backend, tp_group, sliding_window)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused, tp_group)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, fused, tp_group)

    def forward(self, positions, x, residual, meta):
        # with FP8 layers the norms may hand their GEMMs FP8 rows (``input_quant``)
        if residual is None:
            x, residual = self.input_layernorm(x, quant=self.self_attn.qkv_proj.input_quant(x)), x
        else:
            x, residual = self.input_layernorm(x, residual, self.self_attn.qkv_proj.input_quant(x))
        x = self.self_attn(positions, x, meta)
        x, residual = self.post_attention_layernorm(x, residual, self.mlp.input_quant(x))
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    """Embedding, the decoder layers, the final norm: hidden states of every token. ``make_mlp(layer)`` builds
    each layer's MLP."""

    def __init__(self, cfg: ArchConfig, max_position: int, qk_norm: str | None, qkv_bias: bool, backend: str,
                 make_mlp: Callable[[int], nn.Module], tp_group: TPGroup | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp_group)
        self.layers = nn.ModuleList([DecoderLayer(cfg, max_position, qk_norm, qkv_bias, backend, make_mlp(i),
                                                  tp_group, cfg.sliding_window_of(i))
                                     for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, backend == "triton", tp_group)

    def forward(self, input_ids, positions, meta, aux_layers: tuple[int, ...] = ()):
        """The final hidden states [n, hidden]; with ``aux_layers`` also the residual stream entering each of
        those layers, concatenated in their order ([n, len(aux_layers) * hidden]: EAGLE-3's input)."""
        x, residual = self.embed_tokens(input_ids), None  # [n, hidden]
        if aux_layers and self.norm.tp_group is not None:
            raise NotImplementedError("auxiliary hidden states (EAGLE-3) under tensor parallelism")
        if any(not 0 <= i < len(self.layers) for i in aux_layers):
            raise ValueError(f"aux_layers {aux_layers} must be layer indices in [0, {len(self.layers)})")
        aux: dict[int, torch.Tensor] = {}  # stays empty without aux_layers: one tuple test a layer
        for i, layer in enumerate(self.layers):
            if i in aux_layers:
                # NOTE: a copy, or a new sum: the fused norms write into x and residual in place
                aux[i] = x.clone() if residual is None else x + residual  # [n, hidden]
            x, residual = layer(positions, x, residual, meta)
        x, _ = self.norm(x, residual)
        if not aux_layers:
            return x
        return x, torch.cat([aux[i] for i in aux_layers], dim=-1)  # [n, hidden], [n, len(aux_layers) * hidden]


class Qwen3ForCausalLM(nn.Module):
    """Causal LM: ``forward`` gives hidden states of every token; ``compute_logits`` only for sampled rows."""

    qk_norm: str | None = "head"
    qkv_bias = False
    # HF checkpoint name -> (our fused parameter, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ArchConfig, max_position: int | None = None, backend: str = "torch",
                 tp_group: TPGroup | None = None):
        super().__init__()
        max_position = max_position or cfg.max_position_embeddings
        make_mlp = lambda layer: self.make_mlp(cfg, layer, backend, tp_group)
        self.model = DecoderModel(cfg, max_position, self.qk_norm, self.qkv_bias or cfg.attention_bias, backend,
                                  make_mlp, tp_group)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp_group)
        self.tie_word_embeddings = cfg.tie_word_embeddings
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_mlp(self, cfg: ArchConfig, layer: int, backend: str, tp_group: TPGroup | None) -> nn.Module:
        """The MLP of decoder layer ``layer`` (dense here; a mixture of experts overrides it)."""
        return MLP(cfg, backend == "triton", tp_group)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                aux_layers: tuple[int, ...] = ()):
        """Hidden states [n, hidden]; with ``aux_layers`` (EAGLE-3) the pair ``(hidden, aux)`` where ``aux``
        [n, len(aux_layers) * hidden] holds the residual stream entering each of those decoder layers."""
        return self.model(input_ids, positions, meta, aux_layers)

    def compute_logits(self, hidden: torch.Tensor, gather: bool = True) -> torch.Tensor | None:
        """[rows, vocab] on rank 0 (None on ranks > 0); ``gather=False``: each rank's [rows, per_rank] slice."""
        return self.lm_head(hidden, gather)


class LlamaForCausalLM(Qwen3ForCausalLM):
    qk_norm = None


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    qk_norm, qkv_bias = None, True
