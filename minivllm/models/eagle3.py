"""The EAGLE-3 draft head: one Llama decoder layer over the target's fused hidden states, in the published format.

A head drafts the token after position ``p`` from two inputs: the embedding of the token at ``p`` (the target's
sampled one, or the head's own previous draft) and a hidden state of position ``p - 1``. At the first draft step
that hidden state is ``fc`` of the target's residual streams at three layers (low, middle, high; concatenated,
``[n, 3 * target_hidden]``); at each further step it is the head's own pre-norm output of the step before. The
layer's attention reads both halves (``q_proj`` takes ``2 * hidden``: the normalised embedding, then the
normalised hidden state), and writes its own KV cache. Its ``lm_head`` covers a smaller draft vocabulary:
``d2t[i]`` is the offset from draft id ``i`` to its target id (``i + d2t[i]``), ``t2d`` the target ids the draft
vocabulary keeps.

Checkpoint names (``yuhuili/EAGLE3-*``, ``AngelSlim/*_eagle3``): ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d`` and, in some, ``embed_tokens.weight`` (else the target's embedding is
shared). ``minivllm.models.eagle3_loader`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minivllm.config.hf import arch_from_dict
from minivllm.config.model import ArchConfig
from minivllm.layers.attention_metadata import AttentionMetadata
from minivllm.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.layernorm import RMSNorm
from minivllm.layers.linear import QKVParallelLinear, ReplicatedLinear
from minivllm.models.qwen3 import MLP, DecoderAttention

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose input streams EAGLE-3 fuses when the head names none: 2, the middle one and the
    third from last (vLLM's choice), clamped into ``[0, num_layers)`` for models of fewer than four layers."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))


@dataclass(frozen=True)
class Eagle3Config:
    """A head's shapes: ``arch`` its decoder layer's (``vocab_size`` is the target's), ``draft_vocab_size`` its
    ``lm_head`` rows, ``target_hidden_size`` the width of each of the three fused target streams,
    ``aux_layers`` the target layers it was trained on (None: :func:`default_aux_layers`),
    ``norm_before_residual``: the layer's residual is the normalised hidden state (some heads) rather than the
    hidden state as given."""

    arch: ArchConfig
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...] | None = None
    norm_before_residual: bool = False

    @classmethod
    def from_dict(cls, cfg: dict) -> Eagle3Config:
        """Parse a head's ``config.json``; a ValueError names what does not fit the EAGLE-3 format."""
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in EAGLE3_ARCHITECTURES:
            raise ValueError(f"an EAGLE-3 head's config.json must name architectures {list(EAGLE3_ARCHITECTURES)}, "
                             f"got {archs}")
        if cfg.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"an EAGLE-3 head has one decoder layer, config.json says num_hidden_layers="
                             f"{cfg['num_hidden_layers']}")
        eagle = cfg.get("eagle_config") or {}
        if not eagle.get("use_aux_hidden_state", True):
            raise ValueError("eagle_config.use_aux_hidden_state is false: an EAGLE-1 head, not EAGLE-3")
        arch = arch_from_dict({**cfg, "num_hidden_layers": 1})
        draft_vocab = int(cfg.get("draft_vocab_size") or arch.vocab_size)
        if not 0 < draft_vocab <= arch.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={arch.vocab_size}], got {draft_vocab}")
        layers = eagle.get("eagle_aux_hidden_state_layer_ids")
        if layers is not None and len(layers) != 3:
            raise ValueError(f"eagle_config.eagle_aux_hidden_state_layer_ids must name 3 layers, got {layers}")
        return cls(arch, draft_vocab, int(cfg.get("target_hidden_size") or arch.hidden_size),
                   tuple(int(i) for i in layers) if layers is not None else None,
                   bool(cfg.get("norm_before_residual", False)))

    def to_dict(self) -> dict:
        """The ``config.json`` of a head of these shapes (the published layout, which :meth:`from_dict` reads)."""
        a = self.arch
        cfg = {
            "architectures": [EAGLE3_ARCHITECTURES[0]], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
            "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
            "head_dim": a.head_dim, "hidden_act": "silu", "rms_norm_eps": a.rms_norm_eps,
            "rope_theta": a.rope_theta, "max_position_embeddings": a.max_position_embeddings,
            "vocab_size": a.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "tie_word_embeddings": False,
            "attention_bias": a.attention_bias, "torch_dtype": a.dtype,
            "norm_before_residual": self.norm_before_residual,
        }
        if self.aux_layers is not None:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                                   "use_aux_hidden_state": True}
        return cfg

    def aux_layers_for(self, num_target_layers: int) -> tuple[int, ...]:
        """The target layers to fuse, checked against a target of ``num_target_layers`` layers."""
        layers = self.aux_layers if self.aux_layers is not None else default_aux_layers(num_target_layers)
        if any(not 0 <= i < num_target_layers for i in layers):
            raise ValueError(f"the EAGLE-3 head fuses target layers {layers}; the target has {num_target_layers}")
        return tuple(layers)


class Eagle3DecoderLayer(nn.Module):
    """The head's one Llama layer (checkpoint prefix ``midlayer.``): attention over ``[norm(embed),
    hidden_norm(hidden)]`` (``2 * hidden`` wide), then the gated MLP, each after an RMSNorm, the hidden state as
    the residual. :meth:`attention_input` and :meth:`after_attention` are the halves around the attention, so
    that training can run its own attention between them."""

    def __init__(self, cfg: Eagle3Config, max_position: int, backend: str):
        super().__init__()
        a = cfg.arch
        self.norm_before_residual = cfg.norm_before_residual
        self.self_attn = DecoderAttention(a, max_position, None, a.attention_bias, backend)
        self.self_attn.qkv_proj = QKVParallelLinear(2 * a.hidden_size, a.head_dim, a.num_attention_heads,
                                                    a.num_key_value_heads, bias=a.attention_bias)
        self.mlp = MLP(a, backend == "triton")
        # NOTE: unfused norms: the fused ones write into their residual in place, here the caller's hidden states
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention's input [n, 2 * hidden] and the residual [n, hidden]."""
        h = self.hidden_norm(hidden)  # [n, hidden]
        residual = h if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), h], dim=-1), residual

    def after_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's output and the residual (their sum is the layer's output), both [n, hidden]."""
        x, residual = self.post_attention_layernorm(attn_out, residual)
        return self.mlp(x), residual

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(embeds, hidden)
        return self.after_attention(self.self_attn(positions, x, meta), residual)


class Eagle3LlamaForCausalLM(nn.Module):
    """An EAGLE-3 head (see the module docstring). ``forward`` runs one draft step over paged attention with the
    head's own KV cache; ``compute_logits`` gives draft-vocabulary logits, ``draft_to_target`` maps their ids."""

    def __init__(self, cfg: Eagle3Config, max_position: int | None = None, backend: str = "torch"):
        super().__init__()
        a = cfg.arch
        self.config = cfg
        max_position = max_position or a.max_position_embeddings
        self.embed_tokens = VocabParallelEmbedding(a.vocab_size, a.hidden_size)
        self.fc = ReplicatedLinear(3 * cfg.target_hidden_size, a.hidden_size)
        self.midlayer = Eagle3DecoderLayer(cfg, max_position, backend)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = ParallelLMHead(cfg.draft_vocab_size, a.hidden_size)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))  # [draft_vocab]
        self.register_buffer("t2d", torch.zeros(a.vocab_size, dtype=torch.bool))  # [vocab]
        self.t2d[:cfg.draft_vocab_size] = True  # identity maps until a checkpoint's are loaded

    def combine_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's three streams [n, 3 * target_hidden] fused into the head's input [n, hidden]."""
        return self.fc(aux)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: ``(normed, prenorm)``, both [n, hidden]; ``compute_logits(normed)`` drafts, and
        ``prenorm`` is the next step's ``hidden``."""
        x, residual = self.midlayer(positions, self.embed_tokens(input_ids), hidden, meta)
        return self.norm(x, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> draft-vocabulary logits [n, draft_vocab]."""
        return self.lm_head(hidden)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ids (any shape, int64)."""
        return draft_ids + self.d2t[draft_ids]

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [n, draft_vocab] spread over the target vocabulary [n, vocab] (-inf where the draft
        vocabulary has no token), for a distribution the rejection sampler compares with the target's."""
        out = draft_logits.new_full((draft_logits.shape[0], self.t2d.shape[0]), float("-inf"))
        ids = torch.arange(draft_logits.shape[1], device=draft_logits.device)
        out[:, self.draft_to_target(ids)] = draft_logits
        return out
