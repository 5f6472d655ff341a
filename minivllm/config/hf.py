"""Read a Hugging Face checkpoint's ``config.json`` (transformers 4.x or 5.x layout)."""

from __future__ import annotations

import json
import os

from minivllm.config.gemma3 import flatten_gemma3, gemma3_arch_fields, is_gemma3
from minivllm.config.model import ArchConfig

_DTYPE_ALIASES = {"float32": "float32", "float": "float32", "fp32": "float32", "float16": "float16",
                  "half": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def arch_from_dict(cfg: dict, generation_config: dict | None = None) -> ArchConfig:
    """Normalise an HF config dict: ``rope_theta``/``torch_dtype`` (4.x) or ``rope_parameters``/``dtype`` (5.x)."""
    gemma3 = is_gemma3(cfg)
    if gemma3:  # the text model's fields, defaults filled (a multimodal checkpoint nests them)
        cfg = flatten_gemma3(cfg)
    archs = cfg.get("architectures") or []
    if not archs:
        model_type = cfg.get("model_type", "")
        archs = {"qwen3": ["Qwen3ForCausalLM"], "llama": ["LlamaForCausalLM"], "qwen2": ["Qwen2ForCausalLM"],
                 "qwen3_moe": ["Qwen3MoeForCausalLM"], "mixtral": ["MixtralForCausalLM"],
                 "olmoe": ["OlmoeForCausalLM"], "mistral": ["MistralForCausalLM"],
                 "gpt_oss": ["GptOssForCausalLM"]}.get(model_type, [])
    if not archs:
        raise ValueError("config.json names no architecture (no 'architectures' and unknown 'model_type')")
    rope_params = cfg.get("rope_parameters") or {}
    rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", _DEFAULT_ROPE_THETA.get(archs[0], 10000.0)))
    rope_scaling = cfg.get("rope_scaling")
    if rope_scaling is None and rope_params.get("rope_type", "default") not in ("default", None):
        rope_scaling = dict(rope_params)
    if rope_scaling is None and not rope_params.get("rope_type") and archs[0] in _DEFAULT_ROPE_SCALING:
        rope_scaling = dict(_DEFAULT_ROPE_SCALING[archs[0]])
    dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    dtype = _DTYPE_ALIASES.get(str(dtype).replace("torch.", ""), None)
    if dtype is None:
        raise ValueError(f"config.json has an unsupported dtype {cfg.get('dtype') or cfg.get('torch_dtype')!r}")
    eos = _as_id_list(cfg.get("eos_token_id"))
    if generation_config:
        for t in _as_id_list(generation_config.get("eos_token_id")):
            if t not in eos:
                eos.append(t)
    num_heads = cfg["num_attention_heads"]
    return ArchConfig(
        architecture=archs[0],
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=num_heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        dtype=dtype,
        eos_token_ids=eos,
        bos_token_id=cfg.get("bos_token_id"),
        quantization_config=cfg.get("quantization_config"),
        **_moe_fields(cfg),
        **_sliding_window_fields(cfg, archs[0]),
        **_gpt_oss_fields(cfg, archs[0]),
        **(gemma3_arch_fields(cfg) if gemma3 else {}),
    )


#: rope_theta where config.json leaves it out (transformers' ``default_theta``)
_DEFAULT_ROPE_THETA = {"GptOssForCausalLM": 150000.0}
#: rope_scaling where config.json names no RoPE type (transformers' gpt-oss default: YaRN over 4,096 positions)
_DEFAULT_ROPE_SCALING = {"GptOssForCausalLM": dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                                   truncate=False, original_max_position_embeddings=4096)}


def _gpt_oss_fields(cfg: dict, architecture: str) -> dict:
    """gpt-oss: its experts' clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``), its alternating sliding and
    full layers where ``layer_types`` is not given (transformers' default: even layers slide)."""
    if architecture != "GptOssForCausalLM":
        return {}
    fields = dict(swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    if cfg.get("sliding_window") is not None:
        layer_types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                                 for i in range(cfg["num_hidden_layers"])]
        fields.update(sliding_window=cfg["sliding_window"], layer_types=layer_types)
    return fields


# transformers' rules for ``sliding_window``: these slide every layer (``layer_types`` ignored) ...
_SLIDE_ALL_LAYERS = ("MistralForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")
# ... these the layers ``layer_types`` marks, or without it those from ``max_window_layers`` (default 28) on.
# Other architectures (Llama, OLMoE) ignore the field.
_SLIDE_BY_LAYER_TYPES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")


def _sliding_window_fields(cfg: dict, architecture: str) -> dict:
    """``sliding_window`` and which layers it applies to, as transformers reads them (the Qwen families only with
    ``use_sliding_window``)."""
    window = cfg.get("sliding_window")
    if window is None or not cfg.get("use_sliding_window", True):
        return {}
    if architecture in _SLIDE_ALL_LAYERS:
        return dict(sliding_window=window)
    if architecture not in _SLIDE_BY_LAYER_TYPES:
        return {}
    first = cfg.get("max_window_layers", 28)
    layer_types = cfg.get("layer_types") or ["sliding_attention" if i >= first else "full_attention"
                                             for i in range(cfg["num_hidden_layers"])]
    return dict(sliding_window=window, layer_types=layer_types)


def _moe_fields(cfg: dict) -> dict:
    """The mixture-of-experts fields: experts under ``num_experts`` (Qwen3-MoE as published, OLMoE) or
    ``num_local_experts`` (Mixtral; Qwen3-MoE saved by transformers 5.x); each expert's size under
    ``moe_intermediate_size`` (Qwen3-MoE) or ``intermediate_size`` (Mixtral, OLMoE). Nothing for a dense model."""
    num_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if not num_experts:
        return {}
    return dict(num_experts=num_experts, num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
                moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                mlp_only_layers=[int(i) for i in cfg.get("mlp_only_layers") or ()],
                decoder_sparse_step=cfg.get("decoder_sparse_step") or 1, clip_qkv=cfg.get("clip_qkv"))


def load_arch(path: str) -> ArchConfig:
    """Load ``path/config.json`` (and ``generation_config.json`` when present)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no config.json in {path!r}: expected a local Hugging Face checkpoint folder")
    with open(cfg_path) as f:
        cfg = json.load(f)
    gen = None
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            gen = json.load(f)
    return arch_from_dict(cfg, gen)
