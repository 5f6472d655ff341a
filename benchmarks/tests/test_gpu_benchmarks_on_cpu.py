"""The GPU-only benchmark scripts import, parse their arguments and exit cleanly on a machine without a GPU
(so a broken import shows in CI, not in the next device session's time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["kernels/fused_elementwise.py", "kernels/decode_attention.py", "kernels/fused_moe_bench.py",
           "kernels/tune_fused_moe.py", "kernels/bench_lora.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
@pytest.mark.parametrize("script", SCRIPTS)
def test_gpu_benchmark_exits_cleanly_without_a_gpu(script):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nothing to do on this machine" in proc.stdout
