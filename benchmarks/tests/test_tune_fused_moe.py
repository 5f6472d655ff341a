"""The fused MoE tuning script's search space (benchmarks/kernels/tune_fused_moe.py), on the CPU: the candidates
it would time are valid configs, fit in shared memory, and grow with the batch size's rows per expert."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
