"""PEFT LoRA checkpoints: read and check a folder (``adapter_config.json`` + ``adapter_model.safetensors``)
against the base model, without loading a tensor. Pure Python: the engine checks an adapter here before a
request that names it is queued; the runner loads the tensors (``minivllm.lora.weights``).

Supported: ``r``, ``lora_alpha``, ``use_rslora`` (scaling ``alpha / sqrt(r)`` instead of ``alpha / r``), and
target modules among q/k/v/o_proj of attention and gate/up/down_proj of a dense MLP (q/k/v map onto the fused
``qkv_proj``, gate/up onto ``gate_up_proj``). Anything else (DoRA, biases, per-module ranks, embeddings, the
LM head, experts of a mixture-of-experts layer) is refused with a ValueError naming it.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass

from minivllm.config.model import ArchConfig
from minivllm.lora.request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION_MODULES + MLP_MODULES

# "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> layer 3, module q_proj, A
_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True)
class LoRAModuleShape:
    """One adapted module of one decoder layer: its A is ``[rank, in_features]``, its B ``[out_features, rank]``
    (full, unsharded sizes)."""

    layer: int
    module: str  # one of SUPPORTED_MODULES
    in_features: int
    out_features: int


@dataclass(frozen=True)
class PEFTAdapter:
    """A checked PEFT LoRA folder: its rank, the scaling folded into B, and the modules it adapts."""

    request: LoRARequest
    rank: int
    scaling: float
    modules: tuple[LoRAModuleShape, ...]
    weights_path: str

    @property
    def target_modules(self) -> frozenset[str]:
        """The module names adapted in some layer."""
        return frozenset(m.module for m in self.modules)


def module_shape(arch: ArchConfig, module: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of a supported module of ``arch`` (full, unsharded)."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    return {"q_proj": (arch.hidden_size, q), "k_proj": (arch.hidden_size, kv), "v_proj": (arch.hidden_size, kv),
            "o_proj": (q, arch.hidden_size), "gate_proj": (arch.hidden_size, arch.intermediate_size),
            "up_proj": (arch.hidden_size, arch.intermediate_size),
            "down_proj": (arch.intermediate_size, arch.hidden_size)}[module]


def _fail(lora: LoRARequest, what: str) -> ValueError:
    return ValueError(f"LoRA adapter {lora.lora_name!r} ({lora.lora_path}): {what}")


def read_adapter_config(lora: LoRARequest, max_lora_rank: int) -> tuple[int, float, tuple[str, ...]]:
    """``(r, scaling, target_modules)`` from the folder's ``adapter_config.json``; ValueError naming what is
    missing, malformed or unsupported."""
    if not os.path.isdir(lora.lora_path):
        raise _fail(lora, "lora_path is not a folder (a local PEFT adapter folder is needed)")
    path = os.path.join(lora.lora_path, CONFIG_FILE)
    if not os.path.isfile(path):
        raise _fail(lora, f"{CONFIG_FILE} is missing")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise _fail(lora, f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise _fail(lora, f"{CONFIG_FILE} must hold a JSON object")
    peft_type = cfg.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise _fail(lora, f"{CONFIG_FILE}: peft_type {peft_type!r} is not supported (only LORA)")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise _fail(lora, f"{CONFIG_FILE}: r must be an integer >= 1, got {r!r}")
    if r > max_lora_rank:
        raise _fail(lora, f"rank r={r} exceeds max_lora_rank={max_lora_rank} (raise --max-lora-rank)")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise _fail(lora, f"{CONFIG_FILE}: lora_alpha must be a number > 0, got {alpha!r}")
    for key, allowed, what in (("use_dora", (False, None), "DoRA"), ("bias", ("none", None), "LoRA biases"),
                               ("fan_in_fan_out", (False, None), "transposed weights"),
                               ("modules_to_save", (None, []), "fully trained modules"),
                               ("layers_to_transform", (None, []), "a subset of layers"),
                               ("use_qalora", (False, None), "QALoRA"),
                               ("lora_bias", (False, None), "a bias on lora_B"),
                               ("layer_replication", (None, []), "replicated layers"),
                               ("trainable_token_indices", (None, [], {}), "trained token embeddings")):
        if cfg.get(key) not in allowed:
            raise _fail(lora, f"{CONFIG_FILE}: {key}={cfg.get(key)!r} is not supported ({what})")
    for key, default in (("rank_pattern", r), ("alpha_pattern", alpha)):  # per-module values other than the default
        pattern = cfg.get(key) or {}
        if not isinstance(pattern, dict) or any(v != default for v in pattern.values()):
            raise _fail(lora, f"{CONFIG_FILE}: {key}={pattern!r} is not supported (one rank and alpha for every "
                              f"module)")
    targets = cfg.get("target_modules")
    if isinstance(targets, str):
        raise _fail(lora, f"{CONFIG_FILE}: target_modules as a pattern ({targets!r}) is not supported: list the "
                          f"module names, among {', '.join(SUPPORTED_MODULES)}")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise _fail(lora, f"{CONFIG_FILE}: target_modules must be a non-empty list of module names")
    bad = sorted({t.rsplit(".", 1)[-1] for t in targets} - set(SUPPORTED_MODULES))
    if bad:
        raise _fail(lora, f"unsupported target module(s) {', '.join(bad)} (supported: {', '.join(SUPPORTED_MODULES)})")
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    return r, float(scaling), tuple(targets)


def read_safetensors_header(path: str) -> dict[str, dict]:
    """The tensors' ``{name: {"dtype", "shape", ...}}`` of a safetensors file (its JSON header only)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise ValueError(f"a safetensors header of {n} bytes")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def check_adapter(lora: LoRARequest, arch: ArchConfig, max_lora_rank: int) -> PEFTAdapter:
    """Check a PEFT LoRA folder against the base model ``arch``: its config, and every tensor's name and shape
    (read from the safetensors header). ValueError naming the first problem found."""
    rank, scaling, _ = read_adapter_config(lora, max_lora_rank)
    path = os.path.join(lora.lora_path, WEIGHTS_FILE)
    if not os.path.isfile(path):
        other = " (a .bin checkpoint is not supported)" if os.path.isfile(
            os.path.join(lora.lora_path, "adapter_model.bin")) else ""
        raise _fail(lora, f"{WEIGHTS_FILE} is missing{other}")
    try:
        header = read_safetensors_header(path)
    except (OSError, ValueError) as exc:
        raise _fail(lora, f"{WEIGHTS_FILE} is not a safetensors file: {exc}") from None
    seen: dict[tuple[int, str], set[str]] = {}
    for name, info in header.items():
        m = _KEY.fullmatch(name)
        if m is None:
            raise _fail(lora, f"unsupported tensor {name!r}: only lora_A / lora_B weights of "
                              f"{', '.join(SUPPORTED_MODULES)} in the decoder layers are supported")
        layer, block, module, which = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in SUPPORTED_MODULES or (block == "self_attn") != (module in ATTENTION_MODULES):
            raise _fail(lora, f"unsupported target module {block}.{module} (tensor {name!r})")
        if layer >= arch.num_hidden_layers:
            raise _fail(lora, f"tensor {name!r}: layer {layer}, but the model has {arch.num_hidden_layers}")
        if module in MLP_MODULES and arch.is_moe_layer(layer):
            raise _fail(lora, f"target module {module} of layer {layer}: a mixture-of-experts MLP cannot take a "
                              f"LoRA adapter (attention modules only)")
        in_f, out_f = module_shape(arch, module)
        want = [rank, in_f] if which == "A" else [out_f, rank]
        shape = list(info.get("shape", ())) if isinstance(info, dict) else None
        if shape != want:
            raise _fail(lora, f"tensor {name!r} has shape {shape}, expected {want} (rank {rank}); is this an "
                              f"adapter of this base model?")
        seen.setdefault((layer, module), set()).add(which)
    if not seen:
        raise _fail(lora, f"{WEIGHTS_FILE} holds no LoRA weights")
    half = sorted(f"layer {layer} {module}" for (layer, module), ab in seen.items() if len(ab) != 2)
    if half:
        raise _fail(lora, f"lora_A without lora_B (or the reverse) in {', '.join(half)}")
    modules = tuple(LoRAModuleShape(layer, module, *module_shape(arch, module)) for layer, module in sorted(seen))
    return PEFTAdapter(lora, rank, scaling, modules, path)
