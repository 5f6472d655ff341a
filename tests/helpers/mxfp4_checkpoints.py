"""MXFP4 experts in gpt-oss's checkpoint layout, written from a float MoE checkpoint (for tests/test_mxfp4.py), and
the same model with those experts dequantized back to float32 (the reference)."""

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
    paths = []
    for kind, weights in (("mxfp4", quantized), ("dequantized", dequantized)):
        path = out / kind
        path.mkdir(parents=True, exist_ok=True)
        for f in Path(src).iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, path / f.name)
        save_file(weights, path / "model.safetensors")
        if kind == "mxfp4":
            cfg = json.loads((path / "config.json").read_text())
            cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.gate", "model.embed_tokens", "lm_head"]}
            (path / "config.json").write_text(json.dumps(cfg, indent=1))
        paths.append(path)
    return paths[0], paths[1]
