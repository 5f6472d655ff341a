"""benchmarks/gpu_machine/gpu_summary.py: one row per throughput result with vLLM's reference beside it, and the
change in percent of each compare pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _throughput(model: str, workload: str, value: float, runs: list[float]) -> dict:
    key = "ms_per_token" if workload == "one-request" else "output_tok_s"
    return {"benchmark": "throughput", "workload": workload, "model": model, "model_name": model,
            "device_name": "NVIDIA H200", key: value, "runs": [{key: r} for r in runs], "engine_args": {}}


def _summary(folder: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_machine" / "gpu_summary.py"), str(folder)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_rows_carry_the_vllm_reference(tmp_path):
    (tmp_path / "q8b_nano.json").write_text(json.dumps(_throughput("qwen3-8b", "nano", 9457.6, [9445.48, 9469.72])))
    row = next(line for line in _summary(tmp_path) if line.startswith("qwen3-8b nano "))
    assert "9457.60" in row and "8983.00" in row and "9445.48, 9469.72" in row


def test_compare_pairs_give_the_change(tmp_path):
    for side, value in (("before", 1.0), ("after", 1.02)):
        (tmp_path / f"cmp_qwen3-0.6b_one-request_{side}.json").write_text(
            json.dumps(_throughput("qwen3-0.6b", "one-request", value, [value, value])))
    lines = _summary(tmp_path)
    row = next(line for line in lines if line.startswith("qwen3-0.6b_one-request "))
    assert "1.00" in row and "1.02" in row and "+2.00%" in row
