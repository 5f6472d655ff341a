"""The fused MoE tuning script's search space (benchmarks/kernels/tune_fused_moe.py), on the CPU: the candidates
it would time are valid configs, fit in shared memory, and grow with the batch size's rows per expert."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tuner():
    spec = importlib.util.spec_from_file_location("tune_fused_moe", ROOT / "benchmarks" / "kernels" / "tune_fused_moe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_candidates_are_valid_and_pruned_by_rows_per_expert():
    from minivllm.kernels.fused_moe_config import check_config

    tune = _tuner()
    one = tune.candidates(1, 128, 8, quick=False, elem_bytes=2)
    many = tune.candidates(4096, 128, 8, quick=False, elem_bytes=2)
    quick = tune.candidates(4096, 128, 8, quick=True, elem_bytes=2)
    assert {c["BLOCK_SIZE_M"] for c in one} == {16}  # one token: an expert gets one row
    assert {c["BLOCK_SIZE_M"] for c in many} == {16, 32, 64, 128}
    assert 0 < len(quick) < len(many) and all(c in many for c in quick)
    for cfg in one + many:
        assert check_config(cfg) == cfg
        stages, bm, bn, bk = cfg["num_stages"], cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        assert stages * (bm + 2 * bn) * bk * 2 <= tune.SMEM_BYTES
        assert 2 * bm * bn <= tune.ACC_REGS * 32 * cfg["num_warps"]



# NOTE: run in a fresh process: Triton reads TRITON_INTERPRET when the kernels are defined (at import)
DRIVER = """
import argparse, importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("tune_fused_moe", sys.argv[1])
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)
import moe_inputs, timing
from minivllm.kernels import fused_moe_config

def weights(shape, fp8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 64, 32, generator=g) / 6, torch.randn(8, 32, 32, generator=g) / 6, {}

def tokens(shape, m, seed=0):
    return torch.randn(m, 32), torch.full((m, 2), 0.5), torch.randint(0, 8, (m, 2), dtype=torch.int32)

def clock(fn, calls=20, iters=50):  # the fake clock: 32-wide column tiles are the fastest
    out = fn()
    assert out.shape[1] == 32 and torch.isfinite(out).all()
    return 1.0 if fn.__defaults__[0]["BLOCK_SIZE_N"] == 32 else 2.0

moe_inputs.make_weights, moe_inputs.make_tokens, timing.time_in_graph = weights, tokens, clock
fused_moe_config.device_name = lambda device=None: "FAKE_GPU"
tune.SPACE = {**tune.SPACE, "BLOCK_SIZE_N": (64, 32)}
args = argparse.Namespace(fp8=None, batch_sizes=[3], quick=True, out_dir=__import__("pathlib").Path(sys.argv[2]),
                          dry_run=False)
sys.exit(tune.tune(moe_inputs.MoeShape(8, 2, 32, 32), args))
"""


@pytest.mark.slow
def test_tune_writes_the_fastest_config_and_keeps_other_batch_sizes(tmp_path):
    """The tuning loop end to end on the CPU (the kernels in Triton's interpreter, tiny shapes, a fake clock that
    makes 32-wide column tiles the fastest): the file gets that config, and an entry already there for another
    batch size stays."""
    import json
    import os
    import subprocess
    import sys

    from minivllm.kernels import fused_moe_config

    path = tmp_path / fused_moe_config.config_file_name(8, 32, "FAKE_GPU")
    path.write_text(json.dumps({"4096": dict(zip(fused_moe_config.KEYS, (64, 64, 64, 8, 4, 3)))}))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "benchmarks" / "kernels" / "tune_fused_moe.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = fused_moe_config.load_configs(path)
    assert sorted(table) == [3, 4096] and table[3]["BLOCK_SIZE_N"] == 32 and table[4096]["BLOCK_SIZE_M"] == 64
    assert "M=    3" in proc.stdout and "wrote" in proc.stdout
