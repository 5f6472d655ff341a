"""Read an EAGLE-3 head from a local folder in the published format: ``config.json`` and ``*.safetensors`` (or
``pytorch_model.bin``), every tensor's name and shape checked against the config before any is copied."""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors.torch import load_file

from minivllm.models.eagle3 import Eagle3Config, Eagle3LlamaForCausalLM

#: checkpoint name of a q/k/v or gate/up projection -> (our fused parameter, shard id)
_PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def load_eagle3_config(path: str) -> Eagle3Config:
    """The head's ``config.json`` (see ``Eagle3Config.from_dict``)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"no config.json in {path!r}: expected a local EAGLE-3 head folder")
    with open(cfg_path) as f:
        return Eagle3Config.from_dict(json.load(f))


def expected_shapes(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a head with ``cfg``'s shapes, by its checkpoint name (``embed_tokens.weight`` optional)."""
    a = cfg.arch
    h, inter, q, kv = a.hidden_size, a.intermediate_size, a.num_attention_heads * a.head_dim, \
        a.num_key_value_heads * a.head_dim
    shapes = {
        "fc.weight": (h, 3 * cfg.target_hidden_size),
        "midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h), "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h), "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,), "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,), "t2d": (a.vocab_size,), "embed_tokens.weight": (a.vocab_size, h),
    }
    if a.attention_bias:
        shapes.update({"midlayer.self_attn.q_proj.bias": (q,), "midlayer.self_attn.k_proj.bias": (kv,),
                       "midlayer.self_attn.v_proj.bias": (kv,)})
    return shapes


def _canonical(name: str) -> str:
    """Our checkpoint name for a stored one: no ``model.`` prefix, ``layers.0.`` (vLLM's) as ``midlayer.``."""
    name = name.removeprefix("model.")
    return "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name


def read_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``*.safetensors`` files (else its ``pytorch_model.bin``), by canonical name."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        for file in files:
            tensors.update(load_file(file))
    elif os.path.isfile(bin_path := os.path.join(path, "pytorch_model.bin")):
        tensors = torch.load(bin_path, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model.bin in {path!r}")
    return {_canonical(k): v for k, v in tensors.items()}


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """``d2t`` [draft_vocab] maps draft ids into the target vocabulary without repeats, onto the ids ``t2d``
    [vocab] marks; a ValueError otherwise."""
    target = torch.arange(d2t.shape[0]) + d2t.long().cpu()  # [draft_vocab]
    vocab = t2d.shape[0]
    if int(target.min()) < 0 or int(target.max()) >= vocab:
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {vocab})")
    if target.unique().numel() != target.numel():
        raise ValueError("d2t maps two draft ids onto the same target id")
    mask = t2d.bool().cpu()
    if int(mask.sum()) != d2t.shape[0] or not bool(mask[target].all()):
        raise ValueError("t2d does not mark exactly the target ids that d2t maps the draft vocabulary onto")


@torch.no_grad()
def load_eagle3_weights(model: Eagle3LlamaForCausalLM, path: str) -> bool:
    """Copy the checkpoint at ``path`` into ``model``; True when it holds its own ``embed_tokens`` (else the
    caller shares the target's). A ValueError names any tensor the config does not expect, of another shape,
    or missing."""
    tensors = read_checkpoint(path)
    shapes = expected_shapes(model.config)
    unknown = sorted(set(tensors) - set(shapes))
    if unknown:
        raise ValueError(f"{path!r} is not an EAGLE-3 head of this format: unexpected tensors "
                         f"{', '.join(unknown[:8])}")
    missing = sorted(set(shapes) - set(tensors) - {"embed_tokens.weight"})
    if missing:
        raise ValueError(f"EAGLE-3 head {path!r} lacks {', '.join(missing[:8])}")
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"EAGLE-3 head {path!r}: {name} has shape {tuple(t.shape)}, its config.json gives "
                             f"{shapes[name]}")
    check_vocab_maps(tensors["d2t"], tensors["t2d"])
    params = dict(model.named_parameters())
    for name, t in tensors.items():
        if name in ("d2t", "t2d"):
            getattr(model, name).copy_(t)
            continue
        module, _, leaf = name.rpartition(".")
        parent, _, proj = module.rpartition(".")
        if proj in _PACKED:
            fused, shard = _PACKED[proj]
            param = params[f"{parent}.{fused}.{leaf}"]
            param.weight_loader(param, t, shard)
        else:
            params[name].data.copy_(t)
    return "embed_tokens.weight" in tensors


def eagle3_state_dict(model: Eagle3LlamaForCausalLM, with_embedding: bool = False) -> dict[str, torch.Tensor]:
    """The head's tensors under their published names (the fused q/k/v and gate/up split back), ``embed_tokens``
    only ``with_embedding`` (a head that shares the target's leaves it out)."""
    a = model.config.arch
    q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if name == "embed_tokens.weight" and not with_embedding:
            continue
        if ".qkv_proj." in name:
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), p.detach().split([q, kv, kv], dim=0)):
                out[name.replace("qkv_proj", proj)] = part
        elif ".gate_up_proj." in name:
            for proj, part in zip(("gate_proj", "up_proj"), p.detach().chunk(2, dim=0)):
                out[name.replace("gate_up_proj", proj)] = part
        else:
            out[name] = p.detach()
    out["d2t"], out["t2d"] = model.d2t, model.t2d
    return out


def save_eagle3(model: Eagle3LlamaForCausalLM, path: str, dtype: torch.dtype = torch.bfloat16,
                with_embedding: bool = False) -> None:
    """Write ``config.json`` and ``model.safetensors`` of the head at ``path`` (floating tensors in ``dtype``)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
               for k, v in eagle3_state_dict(model, with_embedding).items()}
    save_file(tensors, os.path.join(path, "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
