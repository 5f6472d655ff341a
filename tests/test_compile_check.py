"""Every decode-path Triton kernel (both GEMV variants, MMA tiles and one-row FMA, included) builds for sm_90
without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # NOTE: compiled, not interpreted
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_check.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "FAIL" not in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    for kernel in ("GEMV, 16-row tile", "GEMV, one row, FMA", "q/k norm + RoPE + KV store (fp8)",
                   "all-reduce + add + RMSNorm", "Gumbel pick, sharded", "MoE align: scatter", "MoE align in one program",
                   "MoE grouped GEMM 1 (gate/up + SiLU-and-mul), 64x128, FP8 block",
                   "MoE decode GEMV down, 8 picks a program, FP8 block", "paged attention (PDL), window 128 + sinks",
                   "split-KV decode (PDL), window 128 + sinks", "MoE grouped GEMM 1 (gate/up + clamped SwiGLU), biases",
                   "MoE decode GEMV down, biases (gpt-oss)", "64x128, MXFP4 + biases (gpt-oss)",
                   "MoE decode GEMV gate/up, MXFP4 + biases + clamped SwiGLU (gpt-oss)",
                   "LoRA shrink, bf16, rank 8, split-K 16",
                   "LoRA shrink, bf16, rank 16, FMA, 1 rank row(s) a program", "LoRA expand, bf16, rank 64, 64-row tile"):
        assert kernel in done.stdout, kernel
