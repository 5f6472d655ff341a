"""FP8 checkpoints in the published formats, written from a float checkpoint (for the FP8 tests)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from minivllm.kernels.torch_backend import quantize_weight_fp8_ref

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_fp8_checkpoint(src: str, out: Path, fmt: str, block: tuple[int, int] | None = None) -> Path:
    """``fmt="fp8"``: Qwen3-8B-FP8's form (``weight_scale_inv`` per ``block``); ``fmt="compressed-tensors"``:
    per-channel ``weight_scale`` ``[N, 1]`` with dynamic per-token activations."""
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    tensors = {}
    for f in sorted(Path(src).glob("*.safetensors")):
        for name, t in load_file(f).items():
            if name.endswith(".weight") and name.split(".")[-2] in PROJ:
                w8, scale = quantize_weight_fp8_ref(t, block if fmt == "fp8" else None)
                tensors[name] = w8
                if fmt == "fp8":
                    tensors[name + "_scale_inv"] = scale
                else:
                    tensors[name + "_scale"] = scale.view(-1, 1)
            else:
                tensors[name] = t
    save_file(tensors, out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    if fmt == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                      "weight_block_size": list(block) if block else None}
    else:
        scheme = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False,
                              "symmetric": True},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                                        "symmetric": True},
                  "targets": ["Linear"]}
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized",
                                      "config_groups": {"group_0": scheme}, "ignore": ["lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out
