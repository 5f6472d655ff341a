"""Tiny PEFT LoRA adapters of the tiny checkpoints, and transformers + peft greedy references.

An adapter is ``peft.get_peft_model`` of the base model with a seeded random init of lora_A and lora_B (PEFT
starts B at zero, which would change nothing), saved with ``save_pretrained``: the folder a user would have.
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from pathlib import Path

import torch

from tests.helpers.checkpoints import MODEL_VOCAB, save_random_checkpoint

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
ALL_SEVEN = ATTENTION + MLP

#: tiny dense shapes of the other families (Qwen3's are tests/helpers/checkpoints.py's)
DENSE_SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=MODEL_VOCAB, rms_norm_eps=1e-6, tie_word_embeddings=False)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
            "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 24, "sliding_window": 12})}


def build_dense_checkpoint(out_dir: Path, family: str, seed: int = 0) -> Path:
    """A seeded random tiny ``family`` checkpoint (llama, qwen2, mistral or gemma3) with the tiny tokenizer."""
    if family == "gemma3":
        from tests.helpers.gemma3_checkpoints import build_gemma3_checkpoint

        return build_gemma3_checkpoint(out_dir, seed=seed)
    config_name, model_name, extra = FAMILIES[family]
    return save_random_checkpoint(out_dir, config_name, model_name, {**DENSE_SHAPE, **extra}, seed)


def build_lora_adapter(base: str, out_dir: Path, targets: list[str], r: int = 8, alpha: float = 16,
                       use_rslora: bool = False, seed: int = 0, std: float = 0.3) -> Path:
    """A PEFT LoRA folder for the checkpoint ``base``: ``targets`` of every decoder layer, rank ``r``, seeded
    normal lora_A and lora_B of standard deviation ``std`` (big enough to change greedy tokens)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=use_rslora,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out_dir)
    return out_dir


def edit_adapter_config(path: Path, **changes) -> Path:
    """Rewrite fields of ``path``'s adapter_config.json (a value None removes the field)."""
    cfg_path = Path(path) / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    cfg_path.write_text(json.dumps(cfg))
    return Path(path)


@lru_cache(maxsize=4)
def _peft_model(base: str, adapter: str | None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


@cache
def _peft_greedy(base: str, adapter: str | None, prompt_ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    model = _peft_model(base, adapter)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return tuple(out[0, len(prompt_ids):].tolist())


def peft_greedy(base: str, adapter: str | None, prompt_ids: list[int], n: int) -> list[int]:
    """transformers + peft greedy ``n`` tokens after ``prompt_ids`` (float32; ``adapter`` None: the base model;
    cached)."""
    return list(_peft_greedy(str(base), None if adapter is None else str(adapter), tuple(prompt_ids), n))
