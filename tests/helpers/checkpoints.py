"""Tiny Qwen3 checkpoints for the tests: seeded random weights and a trained byte-level BPE tokenizer
(tests/conftest.py builds the session's fixtures with them)."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

# Tiny Qwen3 shapes the tests use. "vocab_extra" makes the model's vocabulary larger than the
# tokenizer's, as in real Qwen3 checkpoints (151,936 vs 151,669).
TINY_SHAPES = {
    "tied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "untied": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=32, tie_word_embeddings=False),
}
TOKENIZER_VOCAB = 384
MODEL_VOCAB = 448


def _training_text() -> list[str]:
    """A few stdlib sources: text every machine has, so the tokenizer is reproducible."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in ("textwrap.py", "string.py", "bisect.py", "heapq.py", "fnmatch.py"):
        p = stdlib / name
        if p.exists():
            texts.append(p.read_text(encoding="utf-8"))
    texts.append("héllo wörld — naïve café ✓ 你好世界 🙂🚀\n" * 20)
    return texts


def build_tokenizer(out_dir: Path, vocab_size: int = TOKENIZER_VOCAB):
    """Train a byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(out_dir)
    return fast


def build_checkpoint(out_dir: Path, shape: str = "tied", seed: int = 0, initializer_range: float = 0.5,
                     dtype: str = "float32", max_position_embeddings: int = 1024, **overrides) -> Path:
    """A seeded random Qwen3 checkpoint saved with ``save_pretrained``, plus the tiny tokenizer.

    ``overrides``: Qwen3Config fields over the shape's (``vocab_size`` too: default ``MODEL_VOCAB``)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    kw = dict(TINY_SHAPES[shape], vocab_size=MODEL_VOCAB)
    kw.update(overrides)
    cfg = Qwen3Config(max_position_embeddings=max_position_embeddings,
                      initializer_range=initializer_range, rms_norm_eps=1e-6, rope_theta=10000.0,
                      eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=tok.pad_token_id, **kw)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def save_random_checkpoint(out_dir: Path, config_name: str, model_name: str, fields: dict, seed: int = 0,
                           initializer_range: float = 0.5, max_position_embeddings: int = 1024) -> Path:
    """A seeded random float32 model of the transformers classes ``config_name`` / ``model_name`` with config
    ``fields``, saved with ``save_pretrained`` beside the tiny tokenizer in ``out_dir``."""
    import torch
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    cfg = getattr(transformers, config_name)(
        max_position_embeddings=max_position_embeddings, initializer_range=initializer_range, rope_theta=10000.0,
        eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=tok.pad_token_id, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def read_config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
