"""Gemma 3's ``config.json``, as transformers reads it, flattened to the fields ``config.hf`` reads.

A ``gemma3_text`` config (``Gemma3ForCausalLM``, the 1B) is the text model's; a ``gemma3`` one
(``Gemma3ForConditionalGeneration``: 4B, 12B, 27B) nests it under ``text_config`` beside a vision tower's. The
published files leave out what equals transformers' ``Gemma3TextConfig`` defaults (the 4B's ``text_config`` names
only six fields), so those defaults are filled in here. Two RoPE layouts exist: transformers 4.x's ``rope_theta``
(full layers), ``rope_local_base_freq`` (sliding layers) and ``rope_scaling`` (full layers), and 5.x's
``rope_parameters`` keyed by layer type.
"""

from __future__ import annotations

GEMMA3_MODEL_TYPES = ("gemma3", "gemma3_text")

# transformers' Gemma3TextConfig defaults (what a published config leaves out)
TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "pad_token_id": 0, "eos_token_id": 1,
    "bos_token_id": 2, "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0  # transformers' default RoPE bases (full, sliding layers)
SLIDING_WINDOW_PATTERN = 6  # without ``layer_types``: every sixth layer is global
# transformers' ACT2FN names the MLP may use -> torch's ``gelu(approximate=...)``
GELU_APPROXIMATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
# top-level fields of a ``gemma3`` config that apply to its text model
_OUTER_FIELDS = ("architectures", "tie_word_embeddings", "eos_token_id", "bos_token_id", "dtype", "torch_dtype")


def is_gemma3(cfg: dict) -> bool:
    """Whether ``cfg`` is a Gemma 3 config (by ``model_type``, or an architecture that names it)."""
    archs = cfg.get("architectures") or []
    return cfg.get("model_type") in GEMMA3_MODEL_TYPES or any(str(a).startswith("Gemma3For") for a in archs)


def flatten_gemma3(cfg: dict) -> dict:
    """The text model's config of a Gemma 3 ``config.json``: defaults filled, the RoPE fields as
    ``rope_theta`` / ``rope_scaling`` (full layers) and ``rope_local_base_freq``, ``layer_types`` spelled out, and
    ``image_token_id`` (a ``gemma3`` checkpoint's placeholder). ValueError for what the engine cannot run."""
    nested = "text_config" in cfg
    text = dict(cfg.get("text_config") or {}) if nested else dict(cfg)
    if nested:
        text.update({k: cfg[k] for k in _OUTER_FIELDS if cfg.get(k) is not None})
        text.setdefault("tie_word_embeddings", True)
        text.setdefault("architectures", ["Gemma3ForConditionalGeneration"])
        text["image_token_id"] = cfg.get("image_token_index", cfg.get("image_token_id", 262_144))
        # Gemma3ForConditionalGeneration applies no final soft-capping, whatever its text config says
        text["final_logit_softcapping"] = None
    else:
        text.setdefault("architectures", ["Gemma3ForCausalLM"])
    out = {**TEXT_DEFAULTS, **text}
    out.update(_rope_fields(text))
    out.pop("rope_parameters", None)
    _check(out)
    if not out.get("layer_types"):
        pattern = text.get("sliding_window_pattern") or text.get("_sliding_window_pattern") or SLIDING_WINDOW_PATTERN
        out["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                              for i in range(out["num_hidden_layers"])]
    return out


def _rope_fields(text: dict) -> dict:
    """``rope_theta``, ``rope_scaling`` (None: plain RoPE) and ``rope_local_base_freq`` from either layout."""
    params = text.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:  # transformers 5.x, keyed by layer type
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"model config: Gemma 3's sliding layers must use plain RoPE, got "
                             f"rope_parameters.sliding_attention={local}")
        theta = full.pop("rope_theta", GLOBAL_THETA)
        scaling = full if full.get("rope_type", "default") != "default" else None
        return dict(rope_theta=theta, rope_scaling=scaling,
                    rope_local_base_freq=local.get("rope_theta", LOCAL_THETA))
    scaling = text.get("rope_scaling")
    if scaling is not None and (scaling.get("rope_type") or scaling.get("type")) == "default":
        scaling = None
    return dict(rope_theta=text.get("rope_theta", params.get("rope_theta", GLOBAL_THETA)), rope_scaling=scaling,
                rope_local_base_freq=text.get("rope_local_base_freq", LOCAL_THETA))


def _check(cfg: dict) -> None:
    """ValueError naming the field for a Gemma 3 variant this engine does not run."""
    if cfg.get("attn_logit_softcapping") is not None:
        raise ValueError(f"model config: attn_logit_softcapping={cfg['attn_logit_softcapping']} is not supported "
                         "(Gemma 3 sets it null)")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("model config: use_bidirectional_attention=true (an encoder such as EmbeddingGemma) is "
                         "not supported: minivllm runs causal decoders")
    if cfg.get("sliding_window") is None:
        raise ValueError("model config: Gemma 3 needs a sliding_window for its local layers, got null")
    if cfg["hidden_activation"] not in GELU_APPROXIMATIONS:
        raise ValueError(f"model config: hidden_activation must be one of {sorted(GELU_APPROXIMATIONS)}, "
                         f"got {cfg['hidden_activation']!r}")


def gemma3_arch_fields(cfg: dict) -> dict:
    """``ArchConfig`` fields only Gemma 3 sets, from a config ``flatten_gemma3`` gave."""
    return dict(hidden_act=cfg["hidden_activation"], query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
                rope_local_theta=float(cfg["rope_local_base_freq"]),
                final_logit_softcapping=cfg.get("final_logit_softcapping"), image_token_id=cfg.get("image_token_id"))
