"""The engine on the CPU as a user runs it: without ``TRITON_INTERPRET``, which conftest sets for the rest of
the suite (so Triton kernels are checked on the CPU). A Triton kernel reached on the CPU outside the
interpreter crashes; these runs would show it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_every_scenario_runs_without_the_interpreter(tiny_tied_model, tp, tmp_path):
    """``benchmarks/engine/lazy_compiles.py``'s nine scenarios (greedy, temperature, top-k/top-p, logprobs, a
    prefix hit, mixed lengths, a chunked prompt), each twice, at TP=1 and TP=2 (gloo)."""
    if tp > 1 and not torch.distributed.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "engine" / "lazy_compiles.py"), "--model", tiny_tied_model, "--keep-cache",
         "--engine-arg", "device=cpu", "--engine-arg", "max_model_len=1024", "--engine-arg",
         "max_num_batched_tokens=512", "--engine-arg", f"tensor_parallel_size={tp}", "--json-out", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["scenario"] for r in result["scenarios"]][-1].endswith("(chunked prefill) -> 8")
    assert all(r["first_s"] > 0 and r["second_s"] > 0 for r in result["scenarios"])
