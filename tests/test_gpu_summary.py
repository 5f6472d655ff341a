"""scripts/gpu_summary.py names each throughput row by its model, and by its variant for nanovar's files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _throughput(model: str, model_name: str | None, tok_s: list[float]) -> dict:
    return {"benchmark": "throughput", "workload": "nano", "model": model, "model_name": model_name,
            "device_name": "NVIDIA H200", "output_tok_s": sum(tok_s) / len(tok_s), "ms_per_token": 0.1,
            "runs": [{"output_tok_s": t} for t in tok_s],
            "reference": {"vllm": 8983.0, "target": 9881.0} if model_name else None}


def test_rows_name_model_and_variant(tmp_path):
    (tmp_path / "var_qwen3-8b-tp2-rank_pdl256.json").write_text(
        json.dumps(_throughput("qwen3-8b-tp2-rank", None, [16802.15, 16827.81])))
    (tmp_path / "q8b_nano.json").write_text(json.dumps(_throughput("qwen3-8b", "qwen3-8b", [9445.48, 9469.72])))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_summary.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    proxy = next(line for line in lines if line.startswith("qwen3-8b-tp2-rank nano pdl256 "))
    assert "16814.98" in proxy and "16802.15, 16827.81" in proxy
    plain = next(line for line in lines if line.startswith("qwen3-8b nano "))
    assert "pdl256" not in plain and "9457.60" in plain and "8983.00" in plain and "9881.00" in plain
    assert not any(line.startswith("None") for line in lines)
