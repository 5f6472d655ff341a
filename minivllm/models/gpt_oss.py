"""gpt-oss (OpenAI's gpt-oss-20b / 120b) in the model's dtype: Llama's decoder with biases on q/k/v/o, attention
sinks, YaRN RoPE, every other layer sliding over 128 tokens, and a mixture of experts in every layer whose
experts have biases and a clamped SwiGLU.

The checkpoint stores each layer's experts stacked and transposed (``mlp.experts.gate_up_proj [E, H, 2I]`` with
gate and up interleaved column by column, ``down_proj [E, I, H]``, their biases ``[E, 2I]`` / ``[E, H]``): the
loaders here cut and reorder them into ``FusedMoE``'s ``w13 [E, 2 * I_rank, H]`` (gate rows, then up rows) and
``w2 [E, H, I_rank]``. MXFP4 checkpoints (gpt-oss as published: ``*_blocks`` / ``*_scales``) keep the
experts packed (``layers/quantization/mxfp4_moe.py``); the biases, attention and router stay in the model's
dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.config.model import ArchConfig
from minivllm.distributed.group import TPGroup
from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.linear import ReplicatedLinear, RowParallelLinear
from minivllm.layers.quantization.mxfp4_moe import pack_experts_at_construction
from minivllm.models.qwen3 import DecoderAttention, Qwen3ForCausalLM


class GptOssMoE(nn.Module):
    """The router (``router``: a biased logit per expert, replicated, never quantized) and the experts (biased,
    clamped SwiGLU, routed by a softmax over each token's top-k logits). With a ``tp_group`` it returns this
    rank's partial sum, as the dense MLP does."""

    def __init__(self, cfg: ArchConfig, backend: str, tp_group: TPGroup | None = None):
        super().__init__()
        self.router = ReplicatedLinear(cfg.hidden_size, cfg.num_experts, bias=True, quantizable=False)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, True, backend, tp_group, has_bias=True,
                                activation="swigluoai", swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit,
                                routing="topk_softmax")
        experts = self.experts
        experts.w13_weight.weight_loader = lambda p, w: load_gate_up(experts, p, w.transpose(1, 2), 1)
        experts.w13_bias.weight_loader = lambda p, b: load_gate_up(experts, p, b, 1)
        experts.w2_weight.weight_loader = lambda p, w: load_down(experts, p, w)
        experts.w2_bias.weight_loader = lambda p, b: p.data.copy_(b if experts.tp_rank == 0 else torch.zeros_like(b))
        # NOTE: after the float loaders above: MXFP4 experts replace w13/w2 by packed ones with their own loaders
        pack_experts_at_construction(experts, cfg.quantization_config)

    def input_quant(self, x: torch.Tensor) -> None:
        """The norm before this block hands over its rows unquantized (``SparseMoeBlock.input_quant``)."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, hidden]
        return self.experts(x, self.router(x))  # router logits: [n, experts]


def load_gate_up(experts: FusedMoE, param: nn.Parameter, loaded: torch.Tensor, dim: int) -> None:
    """``w13_weight`` / ``w13_bias`` from the checkpoint's interleaved gate/up (``loaded [E, 2I, ...]`` with gate
    ``j`` at ``2j`` and up ``j`` at ``2j + 1`` along ``dim``): this rank's gate slice, then its up slice."""
    inter = experts.intermediate_size_per_rank
    start = experts.tp_rank * inter
    gate, up = loaded.unflatten(dim, (-1, 2)).unbind(dim + 1)  # [E, I, ...] each
    param.data.copy_(torch.cat([gate.narrow(dim, start, inter), up.narrow(dim, start, inter)], dim))


def load_down(experts: FusedMoE, param: nn.Parameter, loaded: torch.Tensor) -> None:
    """``w2_weight [E, H, I_rank]`` from the checkpoint's ``down_proj [E, I, H]``: this rank's rows, transposed."""
    inter = experts.intermediate_size_per_rank
    param.data.copy_(loaded.narrow(1, experts.tp_rank * inter, inter).transpose(1, 2))


def add_sinks_and_output_bias(attn: DecoderAttention, cfg: ArchConfig, tp_group: TPGroup | None) -> None:
    """Make a Llama attention gpt-oss's: a biased o_proj, and ``sinks`` (one logit per query head, this rank's
    heads) for the paged attention's softmax."""
    attn.o_proj = RowParallelLinear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=True,
                                    reduce_results=False, tp_group=tp_group)
    sinks = nn.Parameter(torch.empty(attn.num_heads), requires_grad=False)  # [local heads]
    first = attn.qkv_proj.tp_rank * attn.num_heads
    sinks.weight_loader = lambda p, loaded: p.data.copy_(loaded[first:first + attn.num_heads])
    attn.attn.sinks = sinks


class GptOssForCausalLM(Qwen3ForCausalLM):
    """``GptOssForCausalLM`` checkpoints in bf16 / fp32, or with MXFP4 experts: ``self_attn.sinks`` lands in each
    layer's paged attention, ``mlp.router`` routes, ``mlp.experts.*`` fill the fused experts (``*_blocks`` /
    ``*_scales`` their packed weights and scales, through the loader's MXFP4 names)."""

    qk_norm = None
    checkpoint_substr_mapping = {
        ".self_attn.sinks": ".self_attn.attn.sinks",
        ".experts.gate_up_proj_bias": ".experts.w13_bias",
        ".experts.gate_up_proj": ".experts.w13_weight",
        ".experts.down_proj_bias": ".experts.w2_bias",
        ".experts.down_proj": ".experts.w2_weight",
    }

    def __init__(self, cfg: ArchConfig, max_position: int | None = None, backend: str = "torch",
                 tp_group: TPGroup | None = None):
        if not cfg.is_moe or cfg.swiglu_limit is None:
            raise ValueError("a GptOssForCausalLM config needs num_local_experts and swiglu_limit")
        super().__init__(cfg, max_position, backend, tp_group)
        for layer in self.model.layers:
            add_sinks_and_output_bias(layer.self_attn, cfg, tp_group)

    def make_mlp(self, cfg: ArchConfig, layer: int, backend: str, tp_group: TPGroup | None) -> nn.Module:
        return GptOssMoE(cfg, backend, tp_group)
