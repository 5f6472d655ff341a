"""Which weights are FP8 or MXFP4 and how they are scaled, from the checkpoint's ``quantization_config`` or the
user's ``quantization="fp8"`` (pure Python: the config layer reads it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8Config:
    """FP8 (e4m3) weights of the decoder's linear layers; activations quantized per token, dynamically.

    ``weight_block``: ``(rows, cols)`` of a block sharing one scale (Qwen3-8B-FP8: 128 x 128), or None for one
    scale per output channel. ``from_checkpoint``: the checkpoint stores FP8 weights and their scales (else the
    weights are quantized when loaded). ``scale_name``: the checkpoint's name of the scale tensors.
    """

    weight_block: tuple[int, int] | None = None
    from_checkpoint: bool = False
    scale_name: str = "weight_scale"


def fp8_config(checkpoint_quant: dict | None, quantization: str | None) -> Fp8Config | None:
    """The FP8 layout of a model: the checkpoint's (``"quant_method": "fp8"``, or compressed-tensors FP8 with
    per-channel weights and dynamic per-token activations), else ``quantization="fp8"`` online. ValueError for
    a format this engine does not run."""
    if checkpoint_quant is None:
        return Fp8Config() if quantization == "fp8" else None
    method = checkpoint_quant.get("quant_method")
    if quantization not in (None, "fp8") or (quantization is not None and method == "mxfp4"):
        raise ValueError(f"quantization={quantization!r}, but the checkpoint is quantized with {method!r}")
    if method == "fp8":
        if checkpoint_quant.get("activation_scheme", "dynamic") != "dynamic":
            raise ValueError("FP8 checkpoints with static activation scales are not supported (activation_scheme "
                             f"{checkpoint_quant.get('activation_scheme')!r}); dynamic ones are")
        block = checkpoint_quant.get("weight_block_size")
        if block is not None and (len(block) != 2 or min(block) < 1):
            raise ValueError(f"weight_block_size must be two positive ints, got {block!r}")
        return Fp8Config(tuple(block) if block else None, True, "weight_scale_inv" if block else "weight_scale")
    if method == "compressed-tensors":
        return _compressed_tensors(checkpoint_quant)
    if method == "mxfp4":
        return None  # MXFP4 experts: ``mxfp4_config``
    raise ValueError(f"the checkpoint's quant_method {method!r} is not supported (fp8, compressed-tensors FP8 "
                     "and mxfp4 are)")


def _compressed_tensors(cfg: dict) -> Fp8Config:
    groups = list((cfg.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: one config group is supported, got {len(groups)}")
    w, a = groups[0].get("weights") or {}, groups[0].get("input_activations") or {}
    ok = (w.get("type") == "float" and w.get("num_bits") == 8 and w.get("strategy") == "channel"
          and not w.get("dynamic") and a.get("type") == "float" and a.get("num_bits") == 8
          and a.get("strategy") == "token" and a.get("dynamic"))
    if not ok:
        raise ValueError("compressed-tensors: only FP8 weights per channel with dynamic FP8 activations per token "
                         f"are supported, got weights {w} and activations {a}")
    return Fp8Config(None, True, "weight_scale")


@dataclass(frozen=True)
class Mxfp4Config:
    """MXFP4 experts (gpt-oss's checkpoints, ``"quant_method": "mxfp4"``): each expert weight in e2m1 with one
    e8m0 scale a group of ``block`` input columns, stored as ``*_blocks`` and ``*_scales``. Everything else
    (attention, routers, embedding, LM head) stays in the model's dtype."""

    block: int = 32


def mxfp4_config(checkpoint_quant: dict | None) -> Mxfp4Config | None:
    """The checkpoint's MXFP4 layout, None for any other checkpoint. ValueError where its
    ``modules_to_not_convert`` would keep the experts unquantized (this engine holds every MoE layer's
    experts in MXFP4 or none)."""
    if checkpoint_quant is None or checkpoint_quant.get("quant_method") != "mxfp4":
        return None
    kept = [m for m in checkpoint_quant.get("modules_to_not_convert") or [] if "experts" in m]
    if kept:
        raise ValueError(f"mxfp4 checkpoints with unquantized experts are not supported (modules_to_not_convert "
                         f"names {kept})")
    return Mxfp4Config()
