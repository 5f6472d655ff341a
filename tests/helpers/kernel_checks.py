"""Accuracy checks shared by the fused-kernel tests (CPU interpreter and GPU): kernel vs torch layer."""

from __future__ import annotations

import os

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten element?)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


ROPE_FMA_FRAC = 0.4  # see close_to_layer


def check(out, layer_out, ref32, dtype, max_frac=0.05):
    """out: kernel; layer_out: torch layer in ``dtype``; ref32: torch layer in float32."""
    assert out.dtype == dtype and out.shape == ref32.shape
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref32, rtol=1e-5, atol=1e-5)
        return
    err, layer_err = rel_err(out, ref32), rel_err(layer_out, ref32)
    assert err < 1e-2, f"relative error {err:.2e} vs float32"
    assert err <= 1.5 * layer_err + 1e-3, f"kernel {err:.2e} much worse than the torch layer {layer_err:.2e}"
    close_to_layer(out, layer_out, dtype, max_frac)


def close_to_layer(out, layer_out, dtype, max_frac=0.05):
    """Same op-by-op rounding as the torch layer: equal up to 1-ulp flips (at most ``max_frac`` of elements).

    NOTE: rotary's ``q*cos + rot(q)*sin`` is contracted to an FMA on the GPU (one rounding instead
    of torch's two), so about 20% of its elements differ by 1 ulp; its accuracy against float32 is
    still checked to be as good as the torch layer's.
    """
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    torch.testing.assert_close(out, layer_out, rtol=ulp, atol=ulp * layer_out.abs().max().item())
    assert (out != layer_out).float().mean().item() < max_frac, "too many elements differ from the torch layer"


def gpu_rounding_in_interpreter(monkeypatch) -> bool:
    """Under ``TRITON_INTERPRET=1``: make the interpreter's float32 -> bfloat16 and float32 -> float8 (e4m3)
    casts round to nearest even, as GPUs (and torch) do; True if patched.

    NOTE: the interpreter converts float32 -> bfloat16 by truncation, and float32 -> e4m3 drops the rounding
    carry into the exponent (1.97 -> 1.0 instead of 2.0).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from triton.runtime import interpreter

    orig = getattr(interpreter, "_convert_float", None)
    if orig is None:
        return False
    import numpy as np
    import triton.language as tl

    def convert(x, src_ty, dst_ty, rounding_mode):
        if src_ty == tl.float32 and dst_ty in (tl.bfloat16, tl.float8e4nv):
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            if dst_ty == tl.bfloat16:
                return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(np.shape(x))
            return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(np.shape(x))
        return orig(x, src_ty, dst_ty, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", convert)
    return True
