"""benchmarks/kernels/bench_lora.py off the GPU: its layer shapes, its config parsing, and one layer's calls
(the base GEMM, the shrink and expand on cycled weight copies, the slot grouping) run in Triton's interpreter
(its exit without a GPU: test_gpu_benchmarks_on_cpu.py)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "kernels" / "bench_lora.py"


def _script() -> SimpleNamespace:
    """The script's functions, without running its ``main``."""
    return SimpleNamespace(**runpy.run_path(str(SCRIPT)))


def test_layer_shapes_and_configs():
    bench = _script()
    assert bench.layer_shapes("8b", 1) == {"qkv": (4096, (4096, 1024, 1024)), "o": (4096, (4096,)),
                                           "gate_up": (4096, (12288, 12288)), "down": (12288, (4096,))}
    assert bench.layer_shapes("8b", 2)["qkv"] == (4096, (2048, 512, 512))
    assert bench.parse_ints("16x128x1x0x4", 5, "--shrink-config") == (16, 128, 1, 0, 4)
    assert bench.parse_ints(None, 3, "--expand-config") is None
    with pytest.raises(SystemExit, match="--expand-config takes 3"):
        bench.parse_ints("16x128", 3, "--expand-config")
    with pytest.raises(SystemExit, match="more than --slots"):
        bench.main(["--adapters", "9", "--slots", "8"])


# NOTE: run in a fresh process: Triton reads TRITON_INTERPRET when the kernels are defined (at import)
DRIVER = """
import runpy, sys
import torch
lora_call = runpy.run_path(sys.argv[1])["lora_call"]
base, shrink, expand, both, segments = lora_call(5, 64, (32, 16, 16), 8, 4, 3, torch.float32, None,
                                                 (16, 32, 4), dev="cpu", copies=2)
assert base().shape == (5, 64)
assert segments().counts.tolist() == [2, 2, 1, 0, 0]  # tokens 0..4 over slots 0, 1, 2; none of the base model
for call in (shrink, expand, both):
    call()
print("calls ran")
"""


@pytest.mark.triton
@pytest.mark.slow
def test_one_layers_calls_run_in_the_interpreter():
    """The base GEMM, the shrink, the expand, both, and the slot grouping of one layer, on the CPU."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "calls ran" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
