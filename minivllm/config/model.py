"""The model: its architecture facts (read from the checkpoint) and the user's choices about it."""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.config.fields import arg, at_least, check_types
from minivllm.config.quantization import Fp8Config, Mxfp4Config, fp8_config, mxfp4_config

DTYPES = ("float32", "float16", "bfloat16")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class ArchConfig:
    """Architecture facts of a checkpoint, normalised across transformers 4.x / 5.x ``config.json`` layouts
    (what vLLM keeps as ``ModelConfig.hf_config``). Built by ``minivllm.config.hf.load_arch``."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    dtype: str = "bfloat16"
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    quantization_config: dict | None = None  # the checkpoint's, when its weights are quantized
    # mixture of experts (0 experts: a dense model). Qwen3-MoE: layer i is sparse unless it is in
    # ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step``; its dense layers keep ``intermediate_size``
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's (Mixtral, OLMoE: their ``intermediate_size``)
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to one
    mlp_only_layers: list[int] = field(default_factory=list)
    decoder_sparse_step: int = 1
    clip_qkv: float | None = None  # OLMoE: q, k and v clamped to [-clip_qkv, clip_qkv]
    # sliding-window attention: the query at position p sees keys (p - sliding_window, p]; None: full attention.
    # ``layer_types`` ("sliding_attention" / "full_attention" per layer), where given, says which layers slide
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    # gpt-oss's experts: ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)``, gate clamped above at
    # ``swiglu_limit``, up to [-swiglu_limit, swiglu_limit]; None: the plain gated SiLU of the other models
    swiglu_alpha: float | None = None
    swiglu_limit: float | None = None
    # Gemma 3: the MLP's activation (``gelu_pytorch_tanh``; the others' SiLU), the attention scale
    # ``query_pre_attn_scalar ** -0.5`` (None: ``head_dim ** -0.5``), the RoPE base of sliding layers (None:
    # ``rope_theta``; ``rope_scaling`` is the full layers' alone), ``tanh`` soft-capping of the final logits
    # (None: none), and a multimodal checkpoint's image placeholder token, which a text-only engine refuses
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None
    rope_local_theta: float | None = None
    final_logit_softcapping: float | None = None
    image_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts:
            self._check_moe()
        if self.dtype not in DTYPES:
            raise ValueError(f"model config: dtype must be one of {DTYPES}, got {self.dtype!r}")
        self._check_sliding_window()
        if self.swiglu_limit is not None and not self.swiglu_limit > 0:
            raise ValueError(f"model config: swiglu_limit must be > 0, got {self.swiglu_limit}")

    def _check_sliding_window(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"model config: sliding_window must be >= 1 or null, got {self.sliding_window}")
        if self.layer_types is None:
            return
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"model config: layer_types has {len(self.layer_types)} entries for "
                             f"{self.num_hidden_layers} layers")
        unknown = set(self.layer_types) - set(LAYER_TYPES)
        if unknown:
            raise ValueError(f"model config: layer_types must be among {LAYER_TYPES}, got {sorted(unknown)}")

    def _check_moe(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"model config: num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                             f"got {self.num_experts_per_tok}")
        for name in ("moe_intermediate_size", "decoder_sparse_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.clip_qkv is not None and self.clip_qkv <= 0:
            raise ValueError(f"model config: clip_qkv must be > 0, got {self.clip_qkv}")

    @property
    def is_moe(self) -> bool:
        """A mixture of experts (some layers route each token to ``num_experts_per_tok`` experts)."""
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` is sparse (Qwen3-MoE's rule; every layer of Mixtral and OLMoE)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def sliding_window_of(self, layer: int) -> int | None:
        """The attention window of decoder layer ``layer`` in tokens (None: it attends to the whole context)."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    def num_params(self) -> int:
        """Parameters of the model, from its shapes (embedding, attention, MLPs, every expert, routers; norms
        ignored)."""
        attn = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        dense = 3 * self.hidden_size * self.intermediate_size
        sparse = self.num_experts * (3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size)
        mlps = sum(sparse if self.is_moe_layer(i) else dense for i in range(self.num_hidden_layers))
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * attn + mlps + embed


@dataclass
class ModelConfig:
    """Which checkpoint, in which dtype, how long its sequences may be, how its weights load."""

    model: str
    arch: ArchConfig
    dtype: str | None = arg(None, "float32, float16 or bfloat16 (default: the checkpoint's on a GPU, "
                                  "float32 on the CPU)", choices=DTYPES)
    max_model_len: int | None = arg(None, "longest prompt + output in tokens (default: min(4096, the model's "
                                          "max_position_embeddings))")
    load_format: str = arg("auto", "auto or safetensors (the checkpoint's weights), or dummy (random weights "
                                   "of the right shapes, for benchmarks)", choices=("auto", "safetensors", "dummy"))
    skip_tokenizer_init: bool = arg(False, "load no tokenizer (vLLM's flag): prompts must be token ids, outputs are "
                                           "token ids with empty text; no stop strings, bad words or structured "
                                           "outputs")
    seed: int = arg(0, "random seed of the engine (dummy weights, unseeded sampling)")
    max_logprobs: int = arg(20, "most logprobs a request may ask for per token (logprobs, prompt_logprobs, "
                                "top_logprobs), as in vLLM; -1: the whole vocabulary")
    quantization: str | None = arg(None, "fp8: FP8 (e4m3) weights with one scale per output channel, quantized "
                                         "when loaded (default: the checkpoint's own quantization, if any)",
                                   choices=("fp8",))
    fp8: Fp8Config | None = field(default=None, init=False, repr=False)  # resolved: the checkpoint's or online
    mxfp4: Mxfp4Config | None = field(default=None, init=False, repr=False)  # the checkpoint's MXFP4 experts

    def __post_init__(self) -> None:
        check_types(self)
        self.fp8 = fp8_config(self.arch.quantization_config, self.quantization)  # ValueError if unsupported
        self.mxfp4 = mxfp4_config(self.arch.quantization_config)
        if self.max_model_len is None:
            self.max_model_len = min(4096, self.arch.max_position_embeddings)
        at_least("max_model_len", self.max_model_len, 1)
        at_least("max_logprobs", self.max_logprobs, -1)
        if self.max_model_len > self.arch.max_position_embeddings:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) exceeds the model's max_position_embeddings "
                f"({self.arch.max_position_embeddings})")

    @property
    def max_num_logprobs(self) -> int:
        """``max_logprobs`` as a count: -1 is the vocabulary's size."""
        return self.arch.vocab_size if self.max_logprobs == -1 else self.max_logprobs
