"""Load weights from ``*.safetensors`` (HF names mapped onto fused q/k/v and gate/up), or dummy ones."""

from __future__ import annotations

import glob
import os
import re
from contextlib import contextmanager

import torch
from safetensors import safe_open
from torch import nn


@contextmanager
def build_context(device: torch.device, dtype: torch.dtype):
    """Modules built inside are allocated on ``device`` in ``dtype`` (the target model and a draft model)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(prev)


def load_model_weights(model: nn.Module, mc) -> None:
    """The weights ``mc`` (a ``ModelConfig``) asks for: the checkpoint's or dummy ones, FP8 where it says."""
    from minivllm.layers.quantization import apply_mxfp4, apply_quantization, process_weights_after_loading

    apply_quantization(model, mc.fp8, checkpoint_weights=mc.load_format != "dummy")
    apply_mxfp4(model, mc.mxfp4, checkpoint_weights=mc.load_format != "dummy")
    if mc.load_format == "dummy":
        init_dummy_weights(model, seed=mc.seed)
    else:
        load_weights(model, mc.model)
    process_weights_after_loading(model)


def load_weights(model: nn.Module, path: str) -> None:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path!r} (use load_format='dummy' for random weights)")
    packed = getattr(model, "packed_modules_mapping", {})
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    ignored = tuple(getattr(model, "ignored_checkpoint_prefixes", ()))  # e.g. a vision tower the model lacks
    expert_parts: dict[str, set[tuple]] = {}  # stacked expert weights: the (expert, shard) pairs loaded
    for file in files:
        with safe_open(file, "pt", "cpu") as f:
            for name in f.keys():
                if ignored and name.startswith(ignored):
                    continue
                if "rotary_emb.inv_freq" in name or name.endswith(".input_scale"):
                    continue  # FP8 activations are scaled per token at run time, not by a stored scale
                if name == "lm_head.weight" and getattr(model, "tie_word_embeddings", False):
                    continue
                if (kv := _kv_scale_target(name)) is not None:  # a per-layer FP8 KV cache scale
                    model.get_submodule(kv[0]).load_kv_scale(kv[1], f.get_tensor(name))
                    continue
                target, shard_args = _target(model, name, packed)
                param = params.get(target)
                if param is None:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in {type(model).__name__}")
                loader = getattr(param, "weight_loader", None)
                tensor = f.get_tensor(name)
                if loader is None:
                    param.data.copy_(tensor)
                else:
                    loader(param, tensor, *shard_args)
                loaded.add(target)
                if len(shard_args) == 2:
                    expert_parts.setdefault(target, set()).add(shard_args)
    missing = {n for n in params if n not in loaded}
    for target, parts in expert_parts.items():  # every expert's gate and up (w13), or down (w2)
        expected = params[target].shape[0] * (1 if target.rsplit(".", 1)[-1].startswith("w2_") else 2)
        if len(parts) < expected:
            missing.add(f"{target} ({len(parts)} of its {expected} expert projections)")
    if getattr(model, "tie_word_embeddings", False):
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks weights for: {', '.join(sorted(missing)[:8])}")


_EXPERT_WEIGHT = re.compile(r"(.*\.experts)\.(\d+)\.([^.]+)\.weight(_scale(?:_inv)?)?")
#: gpt-oss's MXFP4 experts: one tensor of blocks and one of scales a projection, for all the experts (the
#: projection's name as stored, or as a model's ``checkpoint_substr_mapping`` renamed it to ours)
_MXFP4_EXPERTS = re.compile(r"(.*\.experts)\.(gate_up_proj|down_proj|w13_weight|w2_weight)_(blocks|scales)")


def _target(model: nn.Module, name: str, packed: dict) -> tuple[str, tuple]:
    """Our parameter for checkpoint tensor ``name``, and the extra arguments of its ``weight_loader``: a fused
    layer's shard id (q/k/v, gate/up), or an expert's ``(expert_id, shard)`` in a MoE layer's stacked weights
    (the model's ``expert_params_mapping``: ``mlp.experts.3.up_proj.weight`` -> ``mlp.experts.w13_weight``,
    ``(3, "up")``; its FP8 scale ``weight_scale_inv`` -> ``w13_weight_scale``; gpt-oss's MXFP4
    ``mlp.experts.gate_up_proj_blocks`` / ``_scales`` -> ``w13_weight`` / ``w13_weight_scale``). The model's
    ``checkpoint_substr_mapping`` renames parts of the name first."""
    for hf_part, ours in getattr(model, "checkpoint_substr_mapping", {}).items():
        name = name.replace(hf_part, ours)
    if m := _MXFP4_EXPERTS.fullmatch(name):  # whole stacked tensors: no shard arguments
        return f"{m.group(1)}.{'w13' if m.group(2) in ('gate_up_proj', 'w13_weight') else 'w2'}_weight" + (
            "_scale" if m.group(3) == "scales" else ""), ()
    experts = getattr(model, "expert_params_mapping", None)
    if experts and (m := _EXPERT_WEIGHT.fullmatch(name)) and m.group(3) in experts:
        shard = experts[m.group(3)]
        scale = "_scale" if m.group(4) else ""
        return f"{m.group(1)}.{'w2' if shard == 'down' else 'w13'}_weight{scale}", (int(m.group(2)), shard)
    target = name.replace(".weight_scale_inv", ".weight_scale")
    for hf_name, (ours, sid) in packed.items():
        if f".{hf_name}." in name:
            return target.replace(hf_name, ours), (sid,)
    return target, ()


_KV_SCALE_SUFFIXES = {".self_attn.k_scale": "k", ".self_attn.v_scale": "v",
                      ".self_attn.k_proj.output_scale": "k", ".self_attn.v_proj.output_scale": "v"}


def _kv_scale_target(name: str) -> tuple[str, str] | None:
    """``(attention module, "k" | "v")`` for a checkpoint's FP8 KV cache scale (vLLM's names, and
    compressed-tensors' ``output_scale`` of k_proj / v_proj), else None."""
    for suffix, which in _KV_SCALE_SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".self_attn.attn", which
    return None


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights of the right shapes (benchmarks); norms get ones. Same on every TP rank."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        if not param.is_floating_point():
            continue  # packed (MXFP4) experts: their quantization method draws their codes
        gen = gens.get(param.device)
        if gen is None:
            gen = gens[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        param.normal_(0.0, std, generator=gen)
