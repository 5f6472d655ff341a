"""MXFP4 experts in gpt-oss's checkpoint layout, written from a float MoE checkpoint (for tests/test_mxfp4.py), and
the same model with those experts dequantized back to float32 (the reference): from a per-expert checkpoint
(Qwen3-MoE, Mixtral, OLMoE) or from a gpt-oss one (stacked, interleaved experts)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from minivllm.kernels.mxfp4 import MXFP4_BLOCK, dequantize_mxfp4, quantize_mxfp4

_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def to_gpt_oss_blocks(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> dict[str, torch.Tensor]:
    """gpt-oss's four expert tensors for stacked float experts ``gate`` / ``up`` [E, I, H] and ``down``
    [E, H, I]: ``gate_up_proj_blocks`` [E, 2I, H/32, 16] with gate and up rows interleaved (row 2i gate,
    2i + 1 up), its ``_scales`` [E, 2I, H/32], ``down_proj_blocks`` [E, H, I/32, 16] and ``_scales``."""
    gate_up = torch.stack([gate, up], dim=2).flatten(1, 2)  # [E, 2I, H]: rows gate0, up0, gate1, up1, ...
    out = {}
    for name, w in (("gate_up_proj", gate_up), ("down_proj", down)):
        blocks, scales = quantize_mxfp4(w)
        out[f"{name}_blocks"] = blocks.view(*w.shape[:2], -1, MXFP4_BLOCK // 2)
        out[f"{name}_scales"] = scales
    return out


def write_mxfp4_checkpoints(src: str, out: Path) -> tuple[Path, Path]:
    """``(mxfp4, dequantized)``: ``src``'s experts in MXFP4 (gpt-oss's names and layout, ``"quant_method":
    "mxfp4"``), everything else as it is; and ``src`` with each expert replaced by those MXFP4 values in
    float32, in its own per-expert layout."""
    tensors: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    for f in sorted(Path(src).glob("*.safetensors")):
        for name, t in load_file(f).items():
            if m := _EXPERT.fullmatch(name):
                experts.setdefault(m.group(1), {})[m.group(3), int(m.group(2))] = t
            else:
                tensors[name] = t
    quantized, dequantized = dict(tensors), dict(tensors)
    for prefix, parts in experts.items():
        count = 1 + max(e for _, e in parts)
        gate, up, down = (torch.stack([parts[p, e] for e in range(count)]) for p in ("gate", "up", "down"))
        packed = to_gpt_oss_blocks(gate, up, down)
        quantized.update({f"{prefix}.{k}": v for k, v in packed.items()})
        gate_up = dequantize_mxfp4(packed["gate_up_proj_blocks"], packed["gate_up_proj_scales"])  # [E, 2I, H]
        back = {"gate": gate_up[:, ::2], "up": gate_up[:, 1::2],
                "down": dequantize_mxfp4(packed["down_proj_blocks"], packed["down_proj_scales"])}
        for p, w in back.items():
            for e in range(count):
                dequantized[f"{prefix}.{e}.{p}_proj.weight"] = w[e].contiguous()
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.gate", "model.embed_tokens", "lm_head"]
    return _write(src, out / "mxfp4", quantized, not_converted), _write(src, out / "dequantized", dequantized)


_STACKED = re.compile(r".*\.experts\.(gate_up_proj|down_proj)")


def write_gpt_oss_mxfp4(src: str, out: Path) -> tuple[Path, Path]:
    """``(mxfp4, reference)`` from a float gpt-oss checkpoint (``mlp.experts.gate_up_proj [E, H, 2I]``, gate
    and up interleaved along the last dimension, ``down_proj [E, I, H]``): its experts quantized to MXFP4 in
    gpt-oss's published layout (``*_blocks`` / ``*_scales``, ``"quant_method": "mxfp4"``), and the same
    checkpoint with those experts as transformers dequantizes them (``convert_moe_packed_tensors``), in float32:
    what transformers runs when it loads the MXFP4 one."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    quantized: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for f in sorted(Path(src).glob("*.safetensors")):
        for name, t in load_file(f).items():
            if not _STACKED.fullmatch(name):
                quantized[name] = reference[name] = t
                continue
            w = t.transpose(1, 2).contiguous()  # [E, N, K]: the output dimension first
            blocks, scales = quantize_mxfp4(w)
            blocks = blocks.view(*w.shape[:2], -1, MXFP4_BLOCK // 2)  # [E, N, K/32, 16]
            quantized[f"{name}_blocks"], quantized[f"{name}_scales"] = blocks, scales
            reference[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    return _write(src, out / "mxfp4", quantized, not_converted), _write(src, out / "reference", reference)


def _write(src: str, path: Path, weights: dict[str, torch.Tensor], not_converted: list[str] | None = None) -> Path:
    """``weights`` as ``path``'s checkpoint beside ``src``'s other files (config, tokenizer); with
    ``not_converted``, marked ``"quant_method": "mxfp4"`` as gpt-oss's checkpoints are."""
    path.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, path / f.name)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    if not_converted is not None:
        cfg = json.loads((path / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": not_converted}
        (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path
