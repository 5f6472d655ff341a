"""Tiny Gemma 3 checkpoints for the tests: seeded random ``Gemma3ForCausalLM`` models (float32) and a tiny
``Gemma3ForConditionalGeneration`` (a small SigLIP tower beside the same text stack), with a sliding window
shorter than most test prompts and the tiny tokenizer of ``checkpoints.py``."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.checkpoints import MODEL_VOCAB, build_tokenizer

#: window of the tiny Gemma 3's local layers: under one 16-token block, so prompts and generations cross it
TINY_WINDOW = 12
#: six layers: five sliding (RoPE base 10,000) then one global (base 1e6, linear scaling 8) as in 4B-27B
GEMMA3_SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24, vocab_size=MODEL_VOCAB, rms_norm_eps=1e-6,
                    query_pre_attn_scalar=20, sliding_window=TINY_WINDOW, max_position_embeddings=1024,
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
#: image placeholder of the tiny multimodal checkpoint: a token inside the tiny vocabulary
TINY_IMAGE_TOKEN = MODEL_VOCAB - 4


def _shape_weights(model, seed: int) -> None:
    """Gemma's norms start at zero (scale one): give them seeded random offsets so the tests see (1 + w); and
    divide the embedding by the sqrt(hidden) the model multiplies it by, else the scaled embedding of the last
    token outweighs every layer and the model only repeats it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
            elif name.endswith("embed_tokens.weight"):
                param.div_(param.shape[1] ** 0.5)


def build_gemma3_checkpoint(out_dir: Path, seed: int = 0, initializer_range: float = 0.5, **overrides) -> Path:
    """A seeded random tiny ``Gemma3ForCausalLM`` (``gemma3_text``) saved in ``out_dir`` beside the tokenizer."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    cfg = Gemma3TextConfig(**{**GEMMA3_SHAPE, **overrides}, initializer_range=initializer_range,
                           eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).to(torch.float32)
    _shape_weights(model, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def build_gemma3_vlm_checkpoint(out_dir: Path, seed: int = 0, initializer_range: float = 0.5) -> Path:
    """A seeded random tiny ``Gemma3ForConditionalGeneration`` (``gemma3``: ``text_config`` nested, a 2-layer
    SigLIP tower) saved in ``out_dir`` beside the tokenizer."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    text = dict(GEMMA3_SHAPE, initializer_range=initializer_range, eos_token_id=tok.eos_token_id,
                bos_token_id=None, pad_token_id=tok.pad_token_id)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=2, image_size=28, patch_size=7, vision_use_head=False)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       image_token_index=TINY_IMAGE_TOKEN, boi_token_index=MODEL_VOCAB - 3,
                       eoi_token_index=MODEL_VOCAB - 2, eos_token_id=tok.eos_token_id,
                       initializer_range=initializer_range)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(cfg).to(torch.float32)
    _shape_weights(model.model.language_model, seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
